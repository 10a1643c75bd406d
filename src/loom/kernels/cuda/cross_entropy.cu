// Softmax cross-entropy over the last dim fused with its gradient, as CUDA kernels
// (kernels/cpu/cross_entropy.cc's twin).
//
// Two kernels. (1) One block per row: m = max_v x_v, s = sum_v exp(x_v - m) (block_max and
// block_sum), then dlogits_v = exp(x_v - m) * (inv_n / s) - onehot(t) * inv_n, and the row's loss
// m + log(s) - x_t (in f64, as the CPU) into a per-row scratch buffer. The row is read three
// times, so as many blocks run as the GPU has multiprocessors (one each, striding over rows): the
// rows in flight (a GPT-2 row is 201 KB) stay in L2 between the reads. A row of V % 4 == 0 (and
// 16-byte aligned) is read and written 4 elements per access, each thread keeping its own
// elements through the three passes. (2) One block adds the row
// losses in f64 in a fixed order and writes loss = total / rows. The scratch (N doubles) is
// stream-ordered memory (common.cuh's StreamScratch), since the interface has no workspace.
// dlogits may be null (loss only). Does not do label smoothing, ignore-index or class weights.
// Invariant: a block reads everything it needs of its row (x_t first, then the max and the sum,
// each behind a barrier) before any thread writes dlogits, and each thread then writes only the
// elements it alone reads, so dlogits may alias logits.
#include <algorithm>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int kRowThreads = 1024;
constexpr int kSumThreads = 1024;

// logits (N,V), targets (N) -> row_loss (N), dlogits (N,V) (may alias logits, may be null).
// A target outside [0,V) gives a NaN row loss and no one-hot term (the caller checks targets on
// the host; this only avoids reading outside the row).
// kVec: V % 4 == 0 and both pointers 16-byte aligned; thread j then owns elements 4j..4j+3,
// 4(j + blockDim.x)..., else j, j + blockDim.x, ...
template <bool kVec>
__global__ void cross_entropy_rows_kernel(const float* logits, const int32_t* targets,
                                          double* row_loss, float* dlogits, int64_t N, int64_t V,
                                          float inv_n) {
  const int64_t V4 = V / 4;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x = logits + n * V;
    const int32_t t = targets[n];
    const bool valid = t >= 0 && t < V;
    const float xt = valid ? x[t] : __int_as_float(0x7fc00000);  // read before any write
    float m = -INFINITY;
    if (kVec) {
      for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
        const F4 a = load4(x, v);
        m = fmaxf(m, fmaxf(fmaxf(a.v[0], a.v[1]), fmaxf(a.v[2], a.v[3])));
      }
    } else {
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    }
    m = block_max(m);
    float s = 0;
    if (kVec) {
      for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
        const F4 a = load4(x, v);
        for (float e : a.v) s += expf(e - m);
      }
    } else {
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - m);
    }
    s = block_sum(s);
    if (dlogits != nullptr) {
      float* d = dlogits + n * V;
      const float k = inv_n / s;
      if (kVec) {
        for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
          F4 a = load4(x, v);
          for (int j = 0; j < 4; ++j) {
            const float p = expf(a.v[j] - m) * k;
            a.v[j] = 4 * v + j == t ? p - inv_n : p;
          }
          store4(d, v, a);
        }
      } else {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
          const float p = expf(x[v] - m) * k;
          d[v] = v == t ? p - inv_n : p;
        }
      }
    }
    if (threadIdx.x == 0) row_loss[n] = double(m) + log(double(s)) - double(xt);
  }
}

int multiprocessors() {
  static const int count = [] {
    int dev = 0, sms = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
          "the multiprocessor count");
    return sms > 0 ? sms : 1;
  }();
  return count;
}

// row_loss (N) -> loss (1) = sum of row_loss, in f64, / rows
__global__ void cross_entropy_loss_kernel(const double* row_loss, float* loss, int64_t N,
                                          int64_t rows) {
  const double total = block_sum_f64(row_loss, N);
  if (threadIdx.x == 0) loss[0] = float(total / double(rows));
}

}  // namespace

// logits (N,V), targets (N) -> loss (1) = sum_n (logsumexp(x_n) - x_n[t_n]) / rows,
// dlogits (N,V) = (softmax - onehot) / rows; rows = 0: N.
void cross_entropy(const float* logits, const int32_t* targets, float* loss, float* dlogits,
                   int64_t N, int64_t V, int64_t rows, Stream s) {
  if (rows <= 0) rows = N;
  StreamScratch row_loss(size_t(std::max<int64_t>(N, 0)) * sizeof(double), s);  // (N)
  if (N > 0) {
    const unsigned grid = unsigned(std::min<int64_t>(N, multiprocessors()));
    const auto kernel = V % 4 == 0 && aligned(16, {logits, dlogits})
                            ? cross_entropy_rows_kernel<true>
                            : cross_entropy_rows_kernel<false>;
    kernel<<<grid, kRowThreads, 0, s>>>(logits, targets, row_loss.get<double>(), dlogits, N, V,
                                        1.0f / float(rows));
    check_launch("cross_entropy (rows)");
  }
  cross_entropy_loss_kernel<<<1, kSumThreads, 0, s>>>(row_loss.get<double>(), loss, N, rows);
  check_launch("cross_entropy (loss)");
}

}  // namespace loom::kernels::cuda
