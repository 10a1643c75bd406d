// Softmax cross-entropy over the last dim fused with its gradient, as CUDA kernels
// (kernels/cpu/cross_entropy.cc's twin).
//
// Two kernels. (1) One block per row: m = max_v x_v, s = sum_v exp(x_v - m) (block_max and
// block_sum), then dlogits_v = exp(x_v - m) * (inv_n / s) - onehot(t) * inv_n, and the row's loss
// m + log(s) - x_t (in f64, as the CPU) into a per-row scratch buffer. (2) One block adds the row
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

constexpr int kRowThreads = 512;
constexpr int kSumThreads = 1024;

// logits (N,V), targets (N) -> row_loss (N), dlogits (N,V) (may alias logits, may be null).
// A target outside [0,V) gives a NaN row loss and no one-hot term (the caller checks targets on
// the host; this only avoids reading outside the row).
__global__ void cross_entropy_rows_kernel(const float* logits, const int32_t* targets,
                                          double* row_loss, float* dlogits, int64_t N, int64_t V,
                                          float inv_n) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x = logits + n * V;
    const int32_t t = targets[n];
    const bool valid = t >= 0 && t < V;
    const float xt = valid ? x[t] : __int_as_float(0x7fc00000);  // read before any write
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    m = block_max(m);
    float s = 0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - m);
    s = block_sum(s);
    if (dlogits != nullptr) {
      float* d = dlogits + n * V;
      const float k = inv_n / s;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float p = expf(x[v] - m) * k;
        d[v] = v == t ? p - inv_n : p;
      }
    }
    if (threadIdx.x == 0) row_loss[n] = double(m) + log(double(s)) - double(xt);
  }
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
    const unsigned grid = unsigned(std::min<int64_t>(N, int64_t(1) << 20));
    cross_entropy_rows_kernel<<<grid, kRowThreads, 0, s>>>(logits, targets, row_loss.get<double>(),
                                                           dlogits, N, V, 1.0f / float(rows));
    check_launch("cross_entropy (rows)");
  }
  cross_entropy_loss_kernel<<<1, kSumThreads, 0, s>>>(row_loss.get<double>(), loss, N, rows);
  check_launch("cross_entropy (loss)");
}

}  // namespace loom::kernels::cuda
