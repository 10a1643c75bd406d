// RMSNorm and LayerNorm CUDA kernels, forward and backward, over the last dim C of x (N,C)
// (kernels/cpu/norm.cc's twins, with the same formulas and f32 arithmetic).
//
// Row-wise work (y, rstd, mean, dx) runs one block per row: each thread strides over the row's
// columns and block_sum adds the threads' partials. The weight gradients dw (and db) sum over
// rows without atomics, in the two fixed stages of common.cuh's column sums: f32 partials over
// chunks of rows (a thread per column, rows in order), then the partials in chunk order in f64.
// Does not use Welford (the variance is two-pass; the row is in L1/L2 for the second pass).
// Invariant: every sum's order depends on N and C only, so results repeat bit for bit.
#include <algorithm>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

// One block per row; rows past the grid loop.
inline unsigned row_blocks(int64_t N) { return unsigned(std::min<int64_t>(N, int64_t(1) << 20)); }

// ---- RMSNorm ----

// x (N,C), w (C) -> y (N,C) = x * rstd * w, rstd (N) = 1/sqrt(mean(x^2) + eps)
__global__ void rmsnorm_fwd_kernel(const float* x, const float* w, float* y, float* rstd, int64_t N,
                                   int64_t C, float eps) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = x + n * C;
    float* yr = y + n * C;
    float ss = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / float(C) + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] * r * w[c];
    if (threadIdx.x == 0) rstd[n] = r;
  }
}

// dy, x (N,C), w (C), rstd (N) -> dx (N,C) = r*w*dy - x * r^3 * sum_c(w*dy*x) / C
__global__ void rmsnorm_bwd_dx_kernel(const float* dy, const float* x, const float* w,
                                      const float* rstd, float* dx, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = x + n * C;
    const float* dyr = dy + n * C;
    float* dxr = dx + n * C;
    const float r = rstd[n];
    float dot = 0;  // sum_c w*dy*x
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dyr[c] * xr[c];
    dot = block_sum(dot);
    // rstd * xhat * mean(w*dy*xhat) = x * rstd^3 * dot / C
    const float k = r * r * r * dot / float(C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dxr[c] = r * w[c] * dyr[c] - k * xr[c];
  }
}

// Stage 1 of dw: partials (chunks,C), partials[b,c] = sum over the rows n of chunk b of
// dy[n,c] * (x[n,c] * rstd[n]), rows in order. A thread per column; blockIdx.y strides over chunks.
__global__ void rmsnorm_dw_partials_kernel(const float* dy, const float* x, const float* rstd,
                                           float* partials, int64_t N, int64_t C,
                                           int64_t chunk_rows, int64_t chunks) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t b = blockIdx.y; b < chunks; b += gridDim.y) {
    const int64_t n1 = std::min(N, (b + 1) * chunk_rows);
    float p = 0;
#pragma unroll 8  // the loads issue ahead of the adds, which stay in order
    for (int64_t n = b * chunk_rows; n < n1; ++n) p += dy[n * C + c] * (x[n * C + c] * rstd[n]);
    partials[b * C + c] = p;
  }
}

// ---- LayerNorm ----

// x (N,C), w, b (C) -> y (N,C) = (x - mean) * rstd * w + b, mean (N), rstd (N)
__global__ void layernorm_fwd_kernel(const float* x, const float* w, const float* b, float* y,
                                     float* mean, float* rstd, int64_t N, int64_t C, float eps) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = x + n * C;
    float* yr = y + n * C;
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
    const float m = block_sum(s) / float(C);
    float ss = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += (xr[c] - m) * (xr[c] - m);
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / float(C) + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (xr[c] - m) * r * w[c] + b[c];
    if (threadIdx.x == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
}

// dy, x (N,C), w (C), mean, rstd (N) -> dx (N,C) = r * (g - mean(g) - xhat * mean(g*xhat)),
// g = dy*w, xhat = (x - mean) * rstd
__global__ void layernorm_bwd_dx_kernel(const float* dy, const float* x, const float* w,
                                        const float* mean, const float* rstd, float* dx, int64_t N,
                                        int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = x + n * C;
    const float* dyr = dy + n * C;
    float* dxr = dx + n * C;
    const float m = mean[n], r = rstd[n];
    float sum_g = 0, sum_gx = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = dyr[c] * w[c];
      sum_g += g;
      sum_gx += g * ((xr[c] - m) * r);
    }
    sum_g = block_sum(sum_g);
    sum_gx = block_sum(sum_gx);
    const float mean_g = sum_g / float(C), mean_gx = sum_gx / float(C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (xr[c] - m) * r;
      dxr[c] = r * (dyr[c] * w[c] - mean_g - xhat * mean_gx);
    }
  }
}

// Stage 1 of dw and db: pdw, pdb (chunks,C) = sums over each chunk's rows of dy*xhat and dy.
__global__ void layernorm_dwdb_partials_kernel(const float* dy, const float* x, const float* mean,
                                               const float* rstd, float* pdw, float* pdb, int64_t N,
                                               int64_t C, int64_t chunk_rows, int64_t chunks) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t b = blockIdx.y; b < chunks; b += gridDim.y) {
    const int64_t n1 = std::min(N, (b + 1) * chunk_rows);
    float pw = 0, pb = 0;
#pragma unroll 8  // the loads issue ahead of the adds, which stay in order
    for (int64_t n = b * chunk_rows; n < n1; ++n) {
      const float d = dy[n * C + c];
      pw += d * ((x[n * C + c] - mean[n]) * rstd[n]);
      pb += d;
    }
    pdw[b * C + c] = pw;
    pdb[b * C + c] = pb;
  }
}

// Stage 2: out (C) = the f64 sum of partials (chunks,C) over chunks, in order (0 when chunks = 0).
__global__ void sum_partials_kernel(const float* partials, float* out, int64_t chunks, int64_t C) {
  for (int64_t c = grid_start(); c < C; c += grid_step())
    out[c] = sum_partial_column(partials, chunks, C, c);
}

// Grid of stage 1: column blocks by chunks (blockIdx.y strides past 65535 chunks).
dim3 partials_grid(int64_t C, int64_t chunks) {
  return dim3(unsigned((C + kThreads - 1) / kThreads),
              unsigned(std::clamp<int64_t>(chunks, 1, 65535)));
}

}  // namespace

// x (N,C), w (C) -> y (N,C), rstd (N)
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                 float eps, Stream s) {
  if (N <= 0) return;
  rmsnorm_fwd_kernel<<<row_blocks(N), kThreads, 0, s>>>(x, w, y, rstd, N, C, eps);
  check_launch("rmsnorm_fwd");
}

// dy (N,C), x (N,C), w (C), rstd (N) -> dx (N,C), dw (C) overwritten.
//   xhat = x*rstd;  dx = rstd*(w*dy - xhat*mean(w*dy*xhat));  dw = sum_n dy*xhat
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                 float* dw, int64_t N, int64_t C, Stream s) {
  if (C <= 0) return;
  if (N > 0) {
    rmsnorm_bwd_dx_kernel<<<row_blocks(N), kThreads, 0, s>>>(dy, x, w, rstd, dx, N, C);
    check_launch("rmsnorm_bwd (dx)");
  }
  const int64_t chunk_rows = column_chunk_rows(N), chunks = column_chunks(N);
  StreamScratch partials(size_t(chunks * C) * sizeof(float), s);  // (chunks,C)
  if (chunks > 0) {
    rmsnorm_dw_partials_kernel<<<partials_grid(C, chunks), kThreads, 0, s>>>(
        dy, x, rstd, partials.get<float>(), N, C, chunk_rows, chunks);
    check_launch("rmsnorm_bwd (dw partials)");
  }
  sum_partials_kernel<<<blocks_for(C), kThreads, 0, s>>>(partials.get<float>(), dw, chunks, C);
  check_launch("rmsnorm_bwd (dw)");
}

// x (N,C), w (C), b (C) -> y (N,C), mean (N), rstd (N)
void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean,
                   float* rstd, int64_t N, int64_t C, float eps, Stream s) {
  if (N <= 0) return;
  layernorm_fwd_kernel<<<row_blocks(N), kThreads, 0, s>>>(x, w, b, y, mean, rstd, N, C, eps);
  check_launch("layernorm_fwd");
}

// dy, x (N,C), w (C), mean, rstd (N) -> dx (N,C), dw (C), db (C) overwritten.
//   xhat = (x-mean)*rstd;  g = dy*w;  dx = rstd*(g - mean(g) - xhat*mean(g*xhat))
//   dw = sum_n dy*xhat;  db = sum_n dy
void layernorm_bwd(const float* dy, const float* x, const float* w, const float* mean,
                   const float* rstd, float* dx, float* dw, float* db, int64_t N, int64_t C,
                   Stream s) {
  if (C <= 0) return;
  if (N > 0) {
    layernorm_bwd_dx_kernel<<<row_blocks(N), kThreads, 0, s>>>(dy, x, w, mean, rstd, dx, N, C);
    check_launch("layernorm_bwd (dx)");
  }
  const int64_t chunk_rows = column_chunk_rows(N), chunks = column_chunks(N);
  StreamScratch partials(size_t(2 * chunks * C) * sizeof(float), s);  // (chunks,C) for dw, db
  float* const pdw = partials.get<float>();
  float* const pdb = chunks > 0 ? pdw + chunks * C : nullptr;
  if (chunks > 0) {
    layernorm_dwdb_partials_kernel<<<partials_grid(C, chunks), kThreads, 0, s>>>(
        dy, x, mean, rstd, pdw, pdb, N, C, chunk_rows, chunks);
    check_launch("layernorm_bwd (dw, db partials)");
  }
  sum_partials_kernel<<<blocks_for(C), kThreads, 0, s>>>(pdw, dw, chunks, C);
  check_launch("layernorm_bwd (dw)");
  sum_partials_kernel<<<blocks_for(C), kThreads, 0, s>>>(pdb, db, chunks, C);
  check_launch("layernorm_bwd (db)");
}

}  // namespace loom::kernels::cuda
