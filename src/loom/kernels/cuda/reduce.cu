// Reductions as CUDA kernels: sum and sum of squares of a whole tensor, and the column sums of a
// matrix (kernels/cpu/reduce.cc's twins), in fixed orders and without atomics.
//
// sum/sumsq: as the CPU, each block of elements is summed in f64 (a thread block per element
// block, threads strided, then block_sum_f64), and one block adds the block sums in f64 and
// rounds once to f32. The element blocks are 4096 long (the CPU's 16384), so that a weight of a
// few million elements still spreads over every multiprocessor; a tensor of at most 16384
// elements (a bias, a norm's weight) is one thread block's, one kernel. sum_rows: common.cuh's
// two-stage column sums (f32 partials over chunks of rows, then the partials in chunk order in
// f64). Partials live in stream-ordered scratch. Invariant: the summation tree depends on n (or N,
// C) only, so results repeat bit for bit.
#include <algorithm>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int64_t kElemBlock = int64_t(1) << 12;  // elements per partial
constexpr int64_t kSmallSum = int64_t(1) << 14;   // at most this many: one kernel
constexpr int kSumThreads = 1024;

// x (n) -> partials (ceil(n / kElemBlock)): block b's sum of x (kSquare: of x^2) in f64
template <bool kSquare>
__global__ void element_block_sums_kernel(const float* x, double* partials, int64_t n) {
  for (int64_t b = blockIdx.x; b * kElemBlock < n; b += gridDim.x) {
    const int64_t i1 = std::min(n, (b + 1) * kElemBlock);
    double s = 0;
    for (int64_t i = b * kElemBlock + threadIdx.x; i < i1; i += blockDim.x) {
      const double v = x[i];
      s += kSquare ? v * v : v;
    }
    s = block_sum_f64(s);
    if (threadIdx.x == 0) partials[b] = s;
  }
}

// x (n <= kSmallSum) -> y (1): the f64 sum (kSquare: of x^2) by one thread block, rounded once, in
// one launch and no scratch
template <bool kSquare>
__global__ void small_sum_kernel(const float* x, float* y, int64_t n) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = x[i];
    s += kSquare ? v * v : v;
  }
  s = block_sum_f64(s);
  if (threadIdx.x == 0) y[0] = float(s);
}

// partials (nb) -> y (1), f64 sum rounded once
__global__ void sum_total_kernel(const double* partials, float* y, int64_t nb) {
  const double total = block_sum_f64(partials, nb);
  if (threadIdx.x == 0) y[0] = float(total);
}

// Stage 1 of sum_rows: partials (chunks,C), partials[b,c] = sum of x[n,c] over the rows of chunk
// b, in order. A thread per column; blockIdx.y strides over chunks.
__global__ void sum_rows_partials_kernel(const float* x, float* partials, int64_t N, int64_t C,
                                         int64_t chunk_rows, int64_t chunks) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t b = blockIdx.y; b < chunks; b += gridDim.y) {
    const int64_t n1 = std::min(N, (b + 1) * chunk_rows);
    float p = 0;
#pragma unroll 8  // the loads issue ahead of the adds, which stay in order
    for (int64_t n = b * chunk_rows; n < n1; ++n) p += x[n * C + c];
    partials[b * C + c] = p;
  }
}

// Stage 2 of sum_rows: y (C) = f64 sum of partials over chunks, in order
__global__ void sum_rows_total_kernel(const float* partials, float* y, int64_t chunks, int64_t C) {
  for (int64_t c = grid_start(); c < C; c += grid_step())
    y[c] = sum_partial_column(partials, chunks, C, c);
}

template <bool kSquare>
void sum_impl(const float* x, float* y, int64_t n, Stream s, const char* name) {
  if (n > 0 && n <= kSmallSum) {  // a bias, a norm's weight: most of a step's gradient norms
    small_sum_kernel<kSquare><<<1, kThreads, 0, s>>>(x, y, n);
    check_launch(name);
    return;
  }
  const int64_t nb = n > 0 ? (n + kElemBlock - 1) / kElemBlock : 0;
  StreamScratch partials(size_t(nb) * sizeof(double), s);  // (nb)
  if (nb > 0) {
    const unsigned grid = unsigned(std::min<int64_t>(nb, int64_t(1) << 20));
    element_block_sums_kernel<kSquare><<<grid, kThreads, 0, s>>>(x, partials.get<double>(), n);
    check_launch(name);
  }
  sum_total_kernel<<<1, kSumThreads, 0, s>>>(partials.get<double>(), y, nb);
  check_launch(name);
}

}  // namespace

// x (n) -> y (1) = sum x
void sum(const float* x, float* y, int64_t n, Stream s) { sum_impl<false>(x, y, n, s, "sum"); }

// x (n) -> y (1) = sum x^2
void sumsq(const float* x, float* y, int64_t n, Stream s) { sum_impl<true>(x, y, n, s, "sumsq"); }

// x (N,C) -> y (C), overwritten
void sum_rows(const float* x, float* y, int64_t N, int64_t C, Stream s) {
  if (C <= 0) return;
  const int64_t chunk_rows = column_chunk_rows(N), chunks = column_chunks(N);
  StreamScratch partials(size_t(chunks * C) * sizeof(float), s);  // (chunks,C)
  if (chunks > 0) {
    const dim3 grid(unsigned((C + kThreads - 1) / kThreads),
                    unsigned(std::min<int64_t>(chunks, 65535)));
    sum_rows_partials_kernel<<<grid, kThreads, 0, s>>>(x, partials.get<float>(), N, C, chunk_rows,
                                                       chunks);
    check_launch("sum_rows (partials)");
  }
  sum_rows_total_kernel<<<blocks_for(C), kThreads, 0, s>>>(partials.get<float>(), y, chunks, C);
  check_launch("sum_rows");
}

}  // namespace loom::kernels::cuda
