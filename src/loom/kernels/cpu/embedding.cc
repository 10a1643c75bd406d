// Embedding lookup and its gradient.
//
// Forward copies table rows; backward scatters dout rows into dtable. Does not check ids in the
// forward (the kernel is not given V); the backward checks them once before writing. An id of -1
// (outside a rank's block of a vocabulary-parallel table: shard_index) is a zero row forward and
// adds nothing backward.
// Invariant: dtable[v,c] = 0 + dout[n0,c] + dout[n1,c] + ... over the n with ids[n] == v, in
// increasing n, whatever the thread count: threads own disjoint column ranges and each walks every
// id in order, so no two threads ever add into the same element and no partials are needed.
#include <cstring>

#include "loom/core/error.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;

namespace {

// dtable[ids[n], c0:c1) += dout[n, c0:c1) for n = 0..N-1 in order.
void scatter_add_columns(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C,
                         int64_t c0, int64_t c1) {
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0) continue;
    float* dst = dtable + int64_t(ids[n]) * C;
    const float* src = dout + n * C;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
  }
}

}  // namespace

// ids (N), table (V,C) -> out (N,C)
void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
  for_blocks(N, detail::rows_per_block(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n)
      if (ids[n] < 0)
        std::memset(out + n * C, 0, size_t(C) * sizeof(float));
      else
        std::memcpy(out + n * C, table + int64_t(ids[n]) * C, size_t(C) * sizeof(float));
  });
}

// ids (N), dout (N,C) -> dtable (V,C), overwritten.
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t V,
                   int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    LOOM_CHECK(ids[n] >= -1 && ids[n] < V)
        << "embedding_bwd: ids[" << n << "] = " << ids[n] << " outside [0," << V << ")";
  for_blocks(V, detail::rows_per_block(C), [&](int64_t v0, int64_t v1) {
    std::memset(dtable + v0 * C, 0, size_t((v1 - v0) * C) * sizeof(float));
  });
  // Column blocks of 64 floats (four cache lines): each block scans all N ids in order.
  constexpr int64_t kCols = 64;
  for_blocks(C, kCols,
             [&](int64_t c0, int64_t c1) { scatter_add_columns(ids, dout, dtable, N, C, c0, c1); });
}

}  // namespace loom::kernels::cpu
