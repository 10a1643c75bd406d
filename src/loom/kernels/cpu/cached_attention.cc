// Attention over a key/value cache (attention.h: cached_attention), the decode step of loom sample.
//
// Two paths. start = 0 (a prefill from an empty cache): the new keys are all there is, so this is
// the causal attention of the Tn new tokens, run by the flash kernel (attention_fwd) after the new
// keys and values are stored. start > 0: each (b, h, query) row is one work item that scores every
// cached key j <= start+i, takes the softmax in f32 (shifted by the max) and sums the values; the
// work is Tn * S * HS per head, small next to the matmuls of one token when Tn is small.
//
// Invariant: every output row is written by one work item in a fixed order, so results are
// bit-identical for any number of threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/kernel_util.h"

namespace loom::kernels::cpu {
namespace {

using detail::from_f32;
using detail::to_f32;

// One query row qi (HS) at absolute position p against keys/values kc, vc rows 0..p (stride ld):
// oi (HS) = softmax(scale * qi . k_j) . v_j. s: scratch of p+1 floats, acc: of HS floats.
template <class Elem>
void attend_row(const Elem* qi, const Elem* kc, const Elem* vc, int64_t ld, int64_t p, int64_t HS,
                float scale, Elem* oi, float* s, float* acc) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= p; ++j) {
    const Elem* kj = kc + j * ld;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < HS; ++d) dot += to_f32(qi[d]) * to_f32(kj[d]);
    s[j] = dot * scale;
    mx = std::max(mx, s[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j <= p; ++j) sum += s[j] = std::exp(s[j] - mx);
  std::fill(acc, acc + HS, 0.0f);
  for (int64_t j = 0; j <= p; ++j) {
    const Elem* vj = vc + j * ld;
    const float w = s[j];
#pragma omp simd
    for (int64_t d = 0; d < HS; ++d) acc[d] += w * to_f32(vj[d]);
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < HS; ++d) oi[d] = from_f32<Elem>(acc[d] * inv);
}

}  // namespace

template <class Elem>
void cached_attention(const Elem* q, const Elem* k, const Elem* v, Elem* kc, Elem* vc, Elem* o,
                      int64_t B, int64_t Tn, int64_t S, int64_t start, int64_t NH, int64_t NKV,
                      int64_t HS, float scale) {
  LOOM_CHECK(B >= 0 && Tn >= 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0)
      << "cached_attention: B=" << B << " Tn=" << Tn << " NH=" << NH << " NKV=" << NKV
      << " HS=" << HS;
  if (start < 0 || start + Tn > S)
    throw Error("cached_attention: positions " + std::to_string(start) + ".." +
                std::to_string(start + Tn - 1) + " are outside the key/value cache of " +
                std::to_string(S) + " positions");
  const int64_t row = NKV * HS;  // one position of one sequence in k, v and the caches
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(kc + (b * S + start) * row, k + b * Tn * row, size_t(Tn * row) * sizeof(Elem));
    std::memcpy(vc + (b * S + start) * row, v + b * Tn * row, size_t(Tn * row) * sizeof(Elem));
  }
  if (B == 0 || Tn == 0) return;
  if (start == 0) {
    std::vector<float> lse(size_t(B * NH * Tn));
    attention_fwd(q, k, v, o, lse.data(), B, Tn, NH, NKV, HS, scale);
    return;
  }
  const int64_t G = NH / NKV;
  const int64_t items = B * NH * Tn;
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(start + Tn)), acc(static_cast<size_t>(HS));
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / (NH * Tn), h = (it / Tn) % NH, i = it % Tn;
      const int64_t g = h / G;
      attend_row(q + ((b * Tn + i) * NH + h) * HS, kc + b * S * row + g * HS,
                 vc + b * S * row + g * HS, row, start + i, HS, scale,
                 o + ((b * Tn + i) * NH + h) * HS, s.data(), acc.data());
    }
  }
}

template void cached_attention<float>(const float*, const float*, const float*, float*, float*,
                                      float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                      int64_t, float);
template void cached_attention<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, bf16*,
                                     int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                     float);

}  // namespace loom::kernels::cpu
