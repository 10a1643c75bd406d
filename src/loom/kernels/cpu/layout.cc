// Layout kernels: N-d transpose (any permutation, 1/2/4/8-byte elements) and split/concat along
// the last dim.
//
// transpose first simplifies the problem: dims of size 1 are dropped, and input dims that stay
// adjacent and in order in the output are merged. Example: (B,T,H,D) with perm (0,2,1,3) stays
// 4-D, but (B,T,H,D) -> (B,T,D,H) is (B*T, H, D) -> (B*T, D, H). Then either
//   - the innermost dim is unpermuted: copy contiguous runs of dims[last] elements (memcpy), or
//   - it is permuted: a tiled 2-D transpose of the plane (input-innermost dim,
//     output-innermost dim), repeated over every index of the other dims.
// Does not handle strided (non-contiguous) inputs or in-place transposes.
// Invariant: a pure copy; every output element is written exactly once, by one thread.
#include <cstring>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;

namespace {

// A transpose after simplification: input dims d (rank r), y.shape[i] = d[p[i]].
struct Perm {
  std::vector<int64_t> d;
  std::vector<int> p;
};

// Drops size-1 dims and merges input dims that are consecutive and in order in the output.
Perm simplify(const int64_t* dims, const int* perm, int rank) {
  std::vector<int> newidx(rank, -1);
  Perm s;
  for (int k = 0; k < rank; ++k)
    if (dims[k] != 1) {
      newidx[k] = int(s.d.size());
      s.d.push_back(dims[k]);
    }
  for (int i = 0; i < rank; ++i)
    if (newidx[perm[i]] >= 0) s.p.push_back(newidx[perm[i]]);
  // Groups of output positions whose input dims run consecutively: group g covers input dims
  // [first[g], first[g] + len[g]).
  std::vector<int> first, len;
  for (size_t i = 0; i < s.p.size(); ++i) {
    if (i > 0 && s.p[i] == s.p[i - 1] + 1) {
      ++len.back();
    } else {
      first.push_back(s.p[i]);
      len.push_back(1);
    }
  }
  // New input dim of group g = its rank among groups ordered by first input dim.
  const int ng = int(first.size());
  std::vector<int> group_at(s.d.size(), -1);  // input dim -> group starting there
  for (int g = 0; g < ng; ++g) group_at[first[g]] = g;
  Perm m;
  std::vector<int> new_dim(ng);
  for (size_t k = 0; k < s.d.size(); ++k) {
    const int g = group_at[k];
    if (g < 0) continue;
    new_dim[g] = int(m.d.size());
    int64_t size = 1;
    for (int j = 0; j < len[g]; ++j) size *= s.d[k + j];
    m.d.push_back(size);
  }
  for (int g = 0; g < ng; ++g) m.p.push_back(new_dim[g]);
  return m;
}

// The 2-D plane case for rows [i0,i1): y[i*out_row + j] = x[j*in_col + i] for all j < cols, in
// kTile x kTile tiles so both the reads and the writes stay within a few cache lines per tile.
template <class T>
void transpose_stripe(const T* x, T* y, int64_t i0, int64_t i1, int64_t cols, int64_t in_col,
                      int64_t out_row) {
  constexpr int64_t kTile = 16;
  for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
    const int64_t j1 = std::min(cols, j0 + kTile);
    for (int64_t i = i0; i < i1; ++i) {
      T* yr = y + i * out_row;
      const T* xc = x + i;
      for (int64_t j = j0; j < j1; ++j) yr[j] = xc[j * in_col];
    }
  }
}

template <class T>
void transpose_impl(const T* x, T* y, const Perm& s) {
  const int r = int(s.d.size());
  int64_t total = 1;
  for (int64_t v : s.d) total *= v;
  if (total == 0) return;
  if (r <= 1) {
    std::memcpy(y, x, size_t(total) * sizeof(T));
    return;
  }
  std::vector<int64_t> is(r, 1), od(r), os(r, 1);  // input strides, output dims, output strides
  for (int k = r - 2; k >= 0; --k) is[k] = is[k + 1] * s.d[k + 1];
  for (int i = 0; i < r; ++i) od[i] = s.d[s.p[i]];
  for (int i = r - 2; i >= 0; --i) os[i] = os[i + 1] * od[i + 1];

  if (s.p[r - 1] == r - 1) {
    // Innermost dim unpermuted: output is M runs of `run` contiguous elements.
    const int64_t run = s.d[r - 1], M = total / run;
    for_blocks(M, detail::rows_per_block(run), [&](int64_t o0, int64_t o1) {
      std::vector<int64_t> idx(r - 1);  // multi-index of run o over od[0..r-1)
      int64_t src = 0;
      int64_t q = o0;
      for (int i = r - 2; i >= 0; --i) {
        idx[i] = q % od[i];
        q /= od[i];
        src += idx[i] * is[s.p[i]];
      }
      for (int64_t o = o0; o < o1; ++o) {
        std::memcpy(y + o * run, x + src, size_t(run) * sizeof(T));
        for (int i = r - 2; i >= 0; --i) {  // odometer; keeps src = sum idx[i]*is[p[i]]
          src += is[s.p[i]];
          if (++idx[i] < od[i]) break;
          src -= idx[i] * is[s.p[i]];
          idx[i] = 0;
        }
      }
    });
    return;
  }

  // Innermost dim permuted. Plane: rows i over input dim r-1 (input stride 1, output stride os[q]),
  // columns j over input dim a = p[r-1] (input stride is[a], output stride 1).
  const int a = s.p[r - 1];
  int q = 0;
  while (s.p[q] != r - 1) ++q;
  const int64_t rows = s.d[r - 1], cols = s.d[a], in_col = is[a], out_row = os[q];
  std::vector<int> outer;  // output positions other than q and r-1
  for (int i = 0; i < r - 1; ++i)
    if (i != q) outer.push_back(i);
  const int64_t M = total / (rows * cols);
  constexpr int64_t kRows = 16;  // rows per work item
  const int64_t row_tiles = detail::num_blocks(rows, kRows);
  for_blocks(M * row_tiles, 1, [&](int64_t w, int64_t) {
    int64_t o = w / row_tiles, src = 0, dst = 0;
    for (int k = int(outer.size()) - 1; k >= 0; --k) {
      const int i = outer[k];
      const int64_t v = o % od[i];
      o /= od[i];
      src += v * is[s.p[i]];
      dst += v * os[i];
    }
    const int64_t i0 = (w % row_tiles) * kRows;
    transpose_stripe(x + src, y + dst, i0, std::min(rows, i0 + kRows), cols, in_col, out_row);
  });
}

}  // namespace

// x with shape dims (rank) -> y with shape dims[perm[i]]; elem bytes per element.
void transpose(const void* x, void* y, const int64_t* dims, const int* perm, int rank, int elem) {
  const Perm s = simplify(dims, perm, rank);
  switch (elem) {
    case 1:
      return transpose_impl(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), s);
    case 2:
      return transpose_impl(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), s);
    case 4:
      return transpose_impl(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), s);
    case 8:
      return transpose_impl(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(y), s);
  }
  LOOM_CHECK(false) << "transpose: element size " << elem << " not in {1,2,4,8}";
}

// x (N, W), W = sum sizes -> ys[i] (N, sizes[i]); elements of `elem` bytes
void split_last(const void* x, void* const* ys, const int64_t* sizes, int k, int64_t N, int elem) {
  int64_t W = 0;
  for (int i = 0; i < k; ++i) W += sizes[i];
  const size_t e = size_t(elem);
  for_blocks(N, detail::rows_per_block(W * elem / 4), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const char* xr = static_cast<const char*>(x) + size_t(r * W) * e;
      for (int i = 0; i < k; ++i) {
        std::memcpy(static_cast<char*>(ys[i]) + size_t(r * sizes[i]) * e, xr, size_t(sizes[i]) * e);
        xr += size_t(sizes[i]) * e;
      }
    }
  });
}

// xs[i] (N, sizes[i]) -> y (N, W), W = sum sizes; elements of `elem` bytes
void concat_last(const void* const* xs, void* y, const int64_t* sizes, int k, int64_t N, int elem) {
  int64_t W = 0;
  for (int i = 0; i < k; ++i) W += sizes[i];
  const size_t e = size_t(elem);
  for_blocks(N, detail::rows_per_block(W * elem / 4), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      char* yr = static_cast<char*>(y) + size_t(r * W) * e;
      for (int i = 0; i < k; ++i) {
        std::memcpy(yr, static_cast<const char*>(xs[i]) + size_t(r * sizes[i]) * e,
                    size_t(sizes[i]) * e);
        yr += size_t(sizes[i]) * e;
      }
    }
  });
}

}  // namespace loom::kernels::cpu
