// Attention over a key/value cache on the GPU (kernels.h: cached_attention), the device twin of
// kernels/cpu/cached_attention.cc: Tn new tokens at positions start..start+Tn-1 of B sequences,
// start read on the GPU (one int32).
//   1. k, v (B,Tn,NKV,HS) are stored into the caches kc, vc (B,S,NKV,HS) at those positions.
//   2. Query i of q (B,Tn,NH,HS) attends to cache positions 0..start+i; o (B,Tn,NH,HS) overwritten.
// Step 2 is attention_fwd's row routine (attention_row.cuh) over the cache, so with start = 0 (the
// cache then holds exactly k and v) o equals attention_fwd's output bit for bit, as on the CPU.
//
// Not done here: checking start against S (the caller checks on the host); cache positions >=
// start+Tn are neither read nor written.
#include "loom/kernels/cuda/attention_row.cuh"

namespace loom::kernels::cuda {
namespace {

// kc, vc (B,S,row) at positions start.. <- k, v (B,Tn,row), row = NKV*HS elements.
template <class Elem>
__global__ void cache_store_kernel(const Elem* k, const Elem* v, Elem* kc, Elem* vc, int64_t B,
                                   int64_t Tn, int64_t S, int64_t row, const int32_t* start) {
  const int64_t per_seq = Tn * row, n = B * per_seq, t0 = start[0];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / per_seq, rest = i % per_seq;
    const int64_t dst = (b * S + t0) * row + rest;
    kc[dst] = k[i];
    vc[dst] = v[i];
  }
}

// o (B,Tn,NH,HS), one block per (b,i,h) row, against cache positions 0..start+i.
template <class Elem>
__global__ void __launch_bounds__(kAttnThreads)
    cached_attention_kernel(const Elem* q, const Elem* kc, const Elem* vc, Elem* o, int64_t B,
                            int64_t Tn, int64_t S, const int32_t* start, int64_t NH, int64_t NKV,
                            int HS, float scale) {
  __shared__ float qs[kAttnMaxHS];
  __shared__ float ps[kAttnChunk];
  const int64_t rows = B * Tn * NH, ld = NKV * HS, t0 = start[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // r = (b, i, h) of o
    const int64_t b = r / (Tn * NH), i = r / NH % Tn, h = r % NH;
    const int64_t kv = b * S * ld + h / (NH / NKV) * HS;  // (b, 0, g, 0) of the caches
    attend_row(q + r * HS, kc + kv, vc + kv, ld, t0 + i + 1, HS, scale, o + r * HS,
               static_cast<float*>(nullptr), qs, ps);
  }
}

}  // namespace

template <class Elem>
void cached_attention(const Elem* q, const Elem* k, const Elem* v, Elem* kc, Elem* vc, Elem* o,
                      int64_t B, int64_t Tn, int64_t S, const int32_t* start, int64_t NH,
                      int64_t NKV, int64_t HS, float scale, Stream s) {
  if (B < 0 || Tn < 0 || NH <= 0 || NKV <= 0 || NH % NKV != 0 || HS <= 0 || HS > kAttnMaxHS)
    check(int(cudaErrorInvalidValue), "cached_attention: bad shape (NH % NKV != 0 or HS > 256)");
  if (B == 0 || Tn == 0) return;
  const int64_t row = NKV * HS;
  cache_store_kernel<Elem>
      <<<blocks_for(B * Tn * row), kThreads, 0, s>>>(k, v, kc, vc, B, Tn, S, row, start);
  check_launch("cache_store_kernel");
  cached_attention_kernel<Elem><<<attn_grid(B * Tn * NH), kAttnThreads, 0, s>>>(
      q, kc, vc, o, B, Tn, S, start, NH, NKV, int(HS), scale);
  check_launch("cached_attention_kernel");
}

template void cached_attention<float>(const float*, const float*, const float*, float*, float*,
                                      float*, int64_t, int64_t, int64_t, const int32_t*, int64_t,
                                      int64_t, int64_t, float, Stream);
template void cached_attention<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, bf16*,
                                     int64_t, int64_t, int64_t, const int32_t*, int64_t, int64_t,
                                     int64_t, float, Stream);

}  // namespace loom::kernels::cuda
