// Mixture-of-Experts routing, dispatch and combine on the GPU (kernels.h), the device twin of
// kernels/cpu/moe.cc. Shapes: logits (B,T,E); gates, experts, slots (B,T,K); the expert layout
// (E,B,S,C) with S slots per expert and sequence; the token layout (B,T,C). slots[i] = -1 marks a
// dropped choice (its expert's S slots in that sequence were full).
//
// Router, in three stream-ordered kernels:
//   1. per token (one thread): softmax statistics in f64 as on the CPU, probabilities (into
//      scratch), top-k by repeated argmax (ties keep the lower index), gates;
//   2. per (sequence b, expert e) (one thread): slots, walking the sequence choice-major (k, then
//      t) exactly as the CPU does. Example, T = 3, K = 2, S = 2, experts (t-major) [0 1 | 0 2 | 0
//      1]: expert 0 sees choices (t0,k0), (t1,k0), (t2,k0) and gives slots 0, 1, -1; expert 1 sees
//      (t0,k1), (t2,k1) and gives 0, 1.
//   3. per expert (one block, and one more block for z_sum): prob_sum, routed, kept summed in f64
//      by a fixed tree over tokens (counts are exact).
// Dispatch zeroes xe then scatters kept rows (distinct choices of a sequence own distinct slots, so
// no two threads write one element); combine and gate_grad gather, one thread (combine) or warp
// (gate_grad) per output element, choices k in order.
//
// Invariant: no atomics; every sum runs in an order fixed by the shape, so runs repeat bit for bit.
// Not done here: the CPU's f64 sums run in token order, these in a tree; results agree to f64
// rounding before the final rounding to f32.
#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {
namespace {

// std::max(a, b) of the CPU code: a unless a < b.
__device__ __forceinline__ float cpu_max(float a, float b) { return a < b ? b : a; }

// Per token n: probs (N,E), lse (N) (f32-rounded log-sum-exp), experts and gates (N,K).
__global__ void moe_route_kernel(const float* logits, float* gates, int32_t* experts, float* probs,
                                 float* lse_out, int64_t N, int64_t E, int64_t K) {
  for (int64_t n = grid_start(); n < N; n += grid_step()) {
    const float* l = logits + n * E;
    float m = l[0];
    for (int64_t e = 1; e < E; ++e) m = cpu_max(m, l[e]);
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += exp(double(l[e] - m));
    const double lse = double(m) + log(z);
    for (int64_t e = 0; e < E; ++e) probs[n * E + e] = float(exp(double(l[e]) - lse));
    int32_t* ex = experts + n * K;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t j = 0; j < k; ++j) taken |= ex[j] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      ex[k] = int32_t(best);
    }
    double gz = 0;
    for (int64_t k = 0; k < K; ++k) gz += exp(double(l[ex[k]] - l[ex[0]]));
    for (int64_t k = 0; k < K; ++k) gates[n * K + k] = float(exp(double(l[ex[k]] - l[ex[0]])) / gz);
    lse_out[n] = float(lse);
  }
}

// Per (b, e): the slots of sequence b's choices of expert e, in choice-major order (k, then t).
__global__ void moe_slots_kernel(const int32_t* experts, int32_t* slots, int64_t B, int64_t T,
                                 int64_t E, int64_t K, int64_t S) {
  for (int64_t be = grid_start(); be < B * E; be += grid_step()) {
    const int64_t b = be / E, e = be % E;
    int64_t fill = 0;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t i = (b * T + t) * K + k;
        if (experts[i] != e) continue;
        slots[i] = fill < S ? int32_t(fill++) : -1;
      }
  }
}

// Block e < E: prob_sum[e], routed[e], kept[e]; block E: z_sum. blockDim = kThreads.
__global__ void moe_stats_kernel(const float* probs, const float* lse, const int32_t* experts,
                                 const int32_t* slots, float* prob_sum, float* z_sum, float* routed,
                                 float* kept, int64_t N, int64_t E, int64_t K) {
  const int64_t e = blockIdx.x;
  if (e == E) {  // uniform per block: the barriers inside block_sum_f64 are safe
    double z = 0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) z += double(lse[n]) * double(lse[n]);
    z = block_sum_f64(z);
    if (threadIdx.x == 0) z_sum[0] = float(z);
    return;
  }
  double ps = 0, rt = 0, kp = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    ps += probs[n * E + e];
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = n * K + k;
      if (experts[i] != e) continue;
      rt += 1;
      if (slots[i] >= 0) kp += 1;
    }
  }
  ps = block_sum_f64(ps);
  rt = block_sum_f64(rt);
  kp = block_sum_f64(kp);
  if (threadIdx.x == 0) {
    prob_sum[e] = float(ps);
    routed[e] = float(rt);
    kept[e] = float(kp);
  }
}

// Per token: dlogits (N,E) of the load-balancing, z-loss and gate terms (moe.cc's formulas, f64).
__global__ void moe_router_bwd_kernel(const float* logits, const float* gates,
                                      const int32_t* experts, const float* dgates,
                                      const float* dprob_sum, const float* dz_sum, float* dlogits,
                                      int64_t N, int64_t E, int64_t K) {
  const double dz = double(dz_sum[0]);
  for (int64_t n = grid_start(); n < N; n += grid_step()) {
    const float* l = logits + n * E;
    float* dl = dlogits + n * E;
    float m = l[0];
    for (int64_t e = 1; e < E; ++e) m = cpu_max(m, l[e]);
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += exp(double(l[e] - m));
    const double lse = double(m) + log(z);
    double pd = 0;
    for (int64_t e = 0; e < E; ++e) pd += exp(double(l[e]) - lse) * dprob_sum[e];
    for (int64_t e = 0; e < E; ++e) {
      const double p = exp(double(l[e]) - lse);
      dl[e] = float(p * (dprob_sum[e] - pd) + dz * 2 * lse * p);
    }
    double gd = 0;
    for (int64_t k = 0; k < K; ++k) gd += double(gates[n * K + k]) * dgates[n * K + k];
    for (int64_t k = 0; k < K; ++k)
      dl[experts[n * K + k]] += float(gates[n * K + k] * (dgates[n * K + k] - gd));
  }
}

// One thread per (choice i, channel c): xe[experts[i], b, slots[i], c] = gate * x[b, t, c].
template <class X>
__global__ void moe_dispatch_kernel(const X* x, const int32_t* experts, const int32_t* slots,
                                    const float* gates, X* xe, int64_t B, int64_t T, int64_t C,
                                    int64_t K, int64_t S) {
  const int64_t n = B * T * K * C;
  for (int64_t idx = grid_start(); idx < n; idx += grid_step()) {
    const int64_t i = idx / C, c = idx % C;  // i = (b*T + t)*K + k
    const int32_t slot = slots[i];
    if (slot < 0) continue;
    const int64_t bt = i / K, b = bt / T;
    const X src = x[bt * C + c];
    X* dst = xe + ((int64_t(experts[i]) * B + b) * S + slot) * C + c;
    *dst = gates ? from_f32<X>(gates[i] * to_f32(src)) : src;
  }
}

// One thread per (token n, channel c): y[n, c] = sum over kept choices k of gate * ye[...].
template <class X>
__global__ void moe_combine_kernel(const X* ye, const int32_t* experts, const int32_t* slots,
                                   const float* gates, float* y, int64_t B, int64_t T, int64_t C,
                                   int64_t K, int64_t S) {
  const int64_t n = B * T * C;
  for (int64_t idx = grid_start(); idx < n; idx += grid_step()) {
    const int64_t bt = idx / C, c = idx % C, b = bt / T;
    float acc = 0.f;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = bt * K + k;
      const int32_t slot = slots[i];
      if (slot < 0) continue;
      const float g = gates ? gates[i] : 1.0f;
      acc += g * to_f32(ye[((int64_t(experts[i]) * B + b) * S + slot) * C + c]);
    }
    y[idx] = acc;
  }
}

// One warp per choice i: dg[i] = ye[experts[i], b, slots[i], :] . y[b, t, :] (0 when dropped).
template <class X, class Y>
__global__ void moe_gate_grad_kernel(const X* ye, const Y* y, const int32_t* experts,
                                     const int32_t* slots, float* dg, int64_t B, int64_t T,
                                     int64_t C, int64_t K, int64_t S) {
  const int64_t n = B * T * K, warps = grid_step() / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t i = grid_start() / 32; i < n; i += warps) {
    const int32_t slot = slots[i];
    float s = 0.f;
    if (slot >= 0) {
      const int64_t bt = i / K, b = bt / T;
      const X* a = ye + ((int64_t(experts[i]) * B + b) * S + slot) * C;
      const Y* v = y + bt * C;
      for (int64_t c = lane; c < C; c += 32) s = fmaf(to_f32(a[c]), to_f32(v[c]), s);
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    if (lane == 0) dg[i] = s;
  }
}

}  // namespace

void moe_router(const float* logits, float* gates, int32_t* experts, int32_t* slots,
                float* prob_sum, float* z_sum, float* routed, float* kept, int64_t B, int64_t T,
                int64_t E, int64_t K, int64_t S, Stream s) {
  if (E <= 0) return;  // no experts: nothing to route or sum
  const int64_t N = B * T;
  void* scratch = nullptr;  // probs (N,E) then lse (N)
  if (N > 0) {
    note_scratch(N * (E + 1) * int64_t(sizeof(float)));
    check(int(cudaMallocAsync(&scratch, size_t(N * (E + 1)) * sizeof(float), s)),
          "moe_router: scratch");
    float* probs = static_cast<float*>(scratch);
    float* lse = probs + N * E;
    moe_route_kernel<<<blocks_for(N), kThreads, 0, s>>>(logits, gates, experts, probs, lse, N, E,
                                                        K);
    check_launch("moe_route_kernel");
    moe_slots_kernel<<<blocks_for(B * E), kThreads, 0, s>>>(experts, slots, B, T, E, K, S);
    check_launch("moe_slots_kernel");
  }
  const float* probs = static_cast<const float*>(scratch);
  const float* lse = N > 0 ? probs + N * E : nullptr;
  moe_stats_kernel<<<unsigned(E + 1), kThreads, 0, s>>>(probs, lse, experts, slots, prob_sum, z_sum,
                                                        routed, kept, N, E, K);
  check_launch("moe_stats_kernel");
  if (scratch) check(int(cudaFreeAsync(scratch, s)), "moe_router: free scratch");
}

void moe_router_bwd(const float* logits, const float* gates, const int32_t* experts,
                    const float* dgates, const float* dprob_sum, const float* dz_sum,
                    float* dlogits, int64_t B, int64_t T, int64_t E, int64_t K, Stream s) {
  const int64_t N = B * T;
  if (N <= 0 || E <= 0) return;
  moe_router_bwd_kernel<<<blocks_for(N), kThreads, 0, s>>>(logits, gates, experts, dgates,
                                                           dprob_sum, dz_sum, dlogits, N, E, K);
  check_launch("moe_router_bwd_kernel");
}

template <class X>
void moe_dispatch(const X* x, const int32_t* experts, const int32_t* slots, const float* gates,
                  X* xe, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S,
                  Stream s) {
  const int64_t total = E * B * S * C;
  if (total <= 0) return;
  check(int(cudaMemsetAsync(xe, 0, size_t(total) * sizeof(X), s)), "moe_dispatch: zero xe");
  const int64_t n = B * T * K * C;
  if (n <= 0) return;
  moe_dispatch_kernel<X>
      <<<blocks_for(n), kThreads, 0, s>>>(x, experts, slots, gates, xe, B, T, C, K, S);
  check_launch("moe_dispatch_kernel");
}

template <class X>
void moe_combine(const X* ye, const int32_t* experts, const int32_t* slots, const float* gates,
                 float* y, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S,
                 Stream s) {
  (void)E;
  const int64_t n = B * T * C;
  if (n <= 0) return;
  moe_combine_kernel<X>
      <<<blocks_for(n), kThreads, 0, s>>>(ye, experts, slots, gates, y, B, T, C, K, S);
  check_launch("moe_combine_kernel");
}

template <class X, class Y>
void moe_gate_grad(const X* ye, const Y* y, const int32_t* experts, const int32_t* slots, float* dg,
                   int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S, Stream s) {
  (void)E;
  const int64_t n = B * T * K;
  if (n <= 0) return;
  moe_gate_grad_kernel<X, Y>
      <<<blocks_for(n * 32), kThreads, 0, s>>>(ye, y, experts, slots, dg, B, T, C, K, S);
  check_launch("moe_gate_grad_kernel");
}

template void moe_dispatch<float>(const float*, const int32_t*, const int32_t*, const float*,
                                  float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                  Stream);
template void moe_dispatch<bf16>(const bf16*, const int32_t*, const int32_t*, const float*, bf16*,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, Stream);
template void moe_combine<float>(const float*, const int32_t*, const int32_t*, const float*, float*,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, Stream);
template void moe_combine<bf16>(const bf16*, const int32_t*, const int32_t*, const float*, float*,
                                int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, Stream);
#define LOOM_GATE_GRAD(X, Y)                                                                    \
  template void moe_gate_grad<X, Y>(const X*, const Y*, const int32_t*, const int32_t*, float*, \
                                    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, Stream);
LOOM_GATE_GRAD(float, float)
LOOM_GATE_GRAD(float, bf16)
LOOM_GATE_GRAD(bf16, float)
LOOM_GATE_GRAD(bf16, bf16)
#undef LOOM_GATE_GRAD

}  // namespace loom::kernels::cuda
