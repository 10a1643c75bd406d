// Embedding lookup and its gradient as CUDA kernels (kernels/cpu/embedding.cc's twins).
//
// Forward copies table rows (a thread per output element); an id of -1 (a vocabulary-parallel
// rank's id outside its block) gives a zero row. Backward needs no atomics: each thread
// owns one column c of one slice of vocabulary rows [v0,v1), zeroes its elements of dtable, then
// walks every id in n order and adds dout[n,c] when ids[n] falls in its slice. A warp tests 32
// ids at once (ballot) and visits the hits in increasing n, so skipping ids is cheap. Ids are not
// checked here (the caller checks them on the host); an id outside [0,V) matches no slice and is
// ignored.
// Invariant: dtable[v,c] = 0 + dout[n0,c] + dout[n1,c] + ... over the n with ids[n] == v, in
// increasing n, added by one thread: bit-identical to the CPU kernel.
#include <algorithm>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int kIdTile = 1024;  // ids staged in shared memory at a time
constexpr int kSlices = 256;   // vocabulary slices (gridDim.y) of the backward

// ids (N), table (V,C) -> out (N,C)
__global__ void embedding_fwd_kernel(const int32_t* ids, const float* table, float* out, int64_t N,
                                     int64_t C) {
  for (int64_t i = grid_start(); i < N * C; i += grid_step()) {
    const int64_t n = i / C, c = i - n * C;
    out[i] = ids[n] < 0 ? 0.0f : table[int64_t(ids[n]) * C + c];  // -1: outside a vocab block
  }
}

// ids (N), dout (N,C) -> dtable rows [v0, v1) of this block's slice, columns blockIdx.x*blockDim.x
// + threadIdx.x (threads past C only help stage ids and vote).
__global__ void embedding_bwd_kernel(const int32_t* ids, const float* dout, float* dtable,
                                     int64_t N, int64_t V, int64_t C, int64_t slice_rows) {
  __shared__ int32_t tile[kIdTile];
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool owns = c < C;
  const int64_t v0 = int64_t(blockIdx.y) * slice_rows, v1 = std::min(V, v0 + slice_rows);
  if (owns)
    for (int64_t v = v0; v < v1; ++v) dtable[v * C + c] = 0.0f;
  const int lane = threadIdx.x & 31;
  for (int64_t n0 = 0; n0 < N; n0 += kIdTile) {
    const int m = int(std::min<int64_t>(kIdTile, N - n0));
    __syncthreads();  // the previous tile is no longer read
    for (int i = threadIdx.x; i < m; i += blockDim.x) tile[i] = ids[n0 + i];
    __syncthreads();
    for (int i0 = 0; i0 < m; i0 += 32) {
      const int32_t id = i0 + lane < m ? tile[i0 + lane] : -1;
      unsigned hits = __ballot_sync(0xffffffffu, id >= v0 && id < v1);
      while (hits != 0) {  // warp-uniform: the hits in increasing n
        const int j = __ffs(hits) - 1;
        hits &= hits - 1;
        const int64_t row = __shfl_sync(0xffffffffu, id, j);
        if (owns) dtable[row * C + c] += dout[(n0 + i0 + j) * C + c];
      }
    }
  }
}

}  // namespace

// ids (N), table (V,C) -> out (N,C)
void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C,
                   Stream s) {
  if (N <= 0 || C <= 0) return;
  embedding_fwd_kernel<<<blocks_for(N * C), kThreads, 0, s>>>(ids, table, out, N, C);
  check_launch("embedding_fwd");
}

// ids (N), dout (N,C) -> dtable (V,C), overwritten (zeros where no id hits).
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t V,
                   int64_t C, Stream s) {
  if (V <= 0 || C <= 0) return;
  const int64_t slices = std::min<int64_t>(V, kSlices);
  const int64_t slice_rows = (V + slices - 1) / slices;
  const int threads = C >= kThreads ? kThreads : int((C + 31) / 32 * 32);
  const dim3 grid(unsigned((C + threads - 1) / threads),
                  unsigned((V + slice_rows - 1) / slice_rows));
  embedding_bwd_kernel<<<grid, threads, 0, s>>>(ids, dout, dtable, N, V, C, slice_rows);
  check_launch("embedding_bwd");
}

}  // namespace loom::kernels::cuda
