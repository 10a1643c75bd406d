// Layout CUDA kernels: N-d transpose (any permutation, 1/2/4/8-byte elements) and split/concat
// along the last dim (kernels/cpu/layout.cc's twins). Pure copies: every output element is
// written exactly once, by one thread.
//
// transpose first simplifies on the host, as the CPU does: dims of size 1 are dropped and input
// dims that stay adjacent and in order in the output are merged, e.g. (B,T,H,D) -> (B,T,D,H) is
// (B*T,H,D) -> (B*T,D,H). Then
//   - rank <= 1: one device-to-device copy;
//   - the innermost input dim is also innermost in the output, or the transposed plane is thin:
//     a thread per output element gathers its input element (index arithmetic in 32 bits when the
//     tensor allows), reads and writes contiguous along the innermost dim;
//   - otherwise a 32x32 shared-memory tile transposes the plane (input-innermost dim,
//     output-innermost dim), so both the reads and the writes are coalesced; the other dims index
//     the tile's plane.
// split_last / concat_last are one strided 2-D copy (cudaMemcpy2DAsync) per part.
// Does not handle strided (non-contiguous) inputs or in-place transposes.
#include <algorithm>
#include <vector>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int kMaxRank = 8;  // after simplification
constexpr int kTile = 32;
constexpr int kTileRowsPerPass = 8;  // blockDim.y of the tiled kernel

// A transpose after simplification: input dims d, y.shape[i] = d[p[i]].
struct Perm {
  std::vector<int64_t> d;
  std::vector<int> p;
};

// Drops size-1 dims and merges input dims that are consecutive and in order in the output.
// Example: dims (2,3,1,4), perm (0,1,3,2): drop the 1 -> (2,3,4) perm (0,1,2): one group, so
// (24) perm (0), a plain copy.
Perm simplify(const int64_t* dims, const int* perm, int rank) {
  std::vector<int> kept(size_t(rank), -1);  // input dim -> its index among the non-1 dims
  Perm s;
  for (int k = 0; k < rank; ++k)
    if (dims[k] != 1) {
      kept[size_t(k)] = int(s.d.size());
      s.d.push_back(dims[k]);
    }
  std::vector<int> p;
  for (int i = 0; i < rank; ++i)
    if (kept[size_t(perm[i])] >= 0) p.push_back(kept[size_t(perm[i])]);
  // Groups of consecutive output positions whose input dims run consecutively: group g covers
  // input dims [first[g], first[g] + len[g]), in output order.
  std::vector<int> first, len;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i > 0 && p[i] == p[i - 1] + 1) {
      ++len.back();
    } else {
      first.push_back(p[i]);
      len.push_back(1);
    }
  }
  // The merged input dims are the groups ordered by their first input dim.
  const int groups = int(first.size());
  std::vector<int> group_at(s.d.size(), -1), merged_index(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) group_at[size_t(first[size_t(g)])] = g;
  Perm m;
  for (size_t k = 0; k < s.d.size(); ++k) {
    const int g = group_at[k];
    if (g < 0) continue;
    merged_index[size_t(g)] = int(m.d.size());
    int64_t size = 1;
    for (int j = 0; j < len[size_t(g)]; ++j) size *= s.d[k + size_t(j)];
    m.d.push_back(size);
  }
  for (int g = 0; g < groups; ++g) m.p.push_back(merged_index[size_t(g)]);
  return m;
}

// The gather form: output dims and, for each, the input stride of that dim.
struct Gather {
  int rank;
  int64_t dims[kMaxRank];
  int64_t in_stride[kMaxRank];
};

// y (total) in output order; I is the index type (uint32_t when total fits, else int64_t).
template <class T, class I>
__global__ void transpose_gather_kernel(const T* x, T* y, int64_t total, Gather g) {
  for (int64_t o = grid_start(); o < total; o += grid_step()) {
    I rem = I(o), src = 0;
#pragma unroll
    for (int k = kMaxRank - 1; k >= 0; --k) {
      if (k < g.rank) {
        const I dk = I(g.dims[k]);
        const I q = rem / dk;
        src += (rem - q * dk) * I(g.in_stride[k]);
        rem = q;
      }
    }
    y[o] = x[src];
  }
}

// The tiled form. The plane: rows i over the input-innermost dim (x stride 1, y stride out_row),
// columns j over the output-innermost dim (x stride in_col, y stride 1). The outer dims (in output
// order) place the plane: x offset sum v*outer_in, y offset sum v*outer_out.
struct Tiled {
  int outer_rank;
  int64_t outer_dims[kMaxRank], outer_in[kMaxRank], outer_out[kMaxRank];
  int64_t rows, cols, in_col, out_row;
  int64_t tiles_r, tiles_c, tiles;  // tiles = (planes) * tiles_r * tiles_c
};

// Block (kTile, kTileRowsPerPass): each block moves one kTile x kTile tile at a time.
template <class T>
__global__ void transpose_tiled_kernel(const T* x, T* y, Tiled t) {
  __shared__ T tile[kTile][kTile + 1];  // tile[j - j0][i - i0]; +1: no bank conflicts
  for (int64_t w = blockIdx.x; w < t.tiles; w += gridDim.x) {
    int64_t q = w;
    const int64_t tc = q % t.tiles_c;
    q /= t.tiles_c;
    const int64_t tr = q % t.tiles_r;
    q /= t.tiles_r;
    int64_t src = 0, dst = 0;
#pragma unroll
    for (int k = kMaxRank - 1; k >= 0; --k) {
      if (k < t.outer_rank) {
        const int64_t v = q % t.outer_dims[k];
        q /= t.outer_dims[k];
        src += v * t.outer_in[k];
        dst += v * t.outer_out[k];
      }
    }
    const int64_t i0 = tr * kTile, j0 = tc * kTile;
    {  // read: threadIdx.x along i (contiguous in x)
      const int64_t i = i0 + threadIdx.x;
      for (int jj = threadIdx.y; jj < kTile; jj += kTileRowsPerPass) {
        const int64_t j = j0 + jj;
        if (i < t.rows && j < t.cols) tile[jj][threadIdx.x] = x[src + j * t.in_col + i];
      }
    }
    __syncthreads();
    {  // write: threadIdx.x along j (contiguous in y)
      const int64_t j = j0 + threadIdx.x;
      for (int ii = threadIdx.y; ii < kTile; ii += kTileRowsPerPass) {
        const int64_t i = i0 + ii;
        if (i < t.rows && j < t.cols) y[dst + i * t.out_row + j] = tile[threadIdx.x][ii];
      }
    }
    __syncthreads();  // the tile is free for the next one
  }
}

template <class T>
void transpose_typed(const T* x, T* y, const Perm& s, int64_t total, Stream st) {
  const int r = int(s.d.size());
  if (r > kMaxRank)
    check(cudaErrorInvalidValue, "transpose: more than 8 dims after merging adjacent ones");
  int64_t is[kMaxRank], od[kMaxRank], os[kMaxRank];  // input strides, output dims and strides
  int64_t stride = 1;
  for (int k = r - 1; k >= 0; --k) {
    is[k] = stride;
    stride *= s.d[size_t(k)];
  }
  for (int i = 0; i < r; ++i) od[i] = s.d[size_t(s.p[size_t(i)])];
  os[r - 1] = 1;
  for (int i = r - 2; i >= 0; --i) os[i] = os[i + 1] * od[i + 1];

  // The plane of the tiled form: input dim r-1 is output position q; input dim a is innermost.
  const int a = s.p[size_t(r - 1)];
  int q = 0;
  while (s.p[size_t(q)] != r - 1) ++q;
  const int64_t rows = s.d[size_t(r - 1)], cols = s.d[size_t(a)];
  if (a == r - 1 || std::min(rows, cols) < kTile / 2) {
    Gather g{};
    g.rank = r;
    for (int i = 0; i < r; ++i) {
      g.dims[i] = od[i];
      g.in_stride[i] = is[s.p[size_t(i)]];
    }
    if (total <= int64_t(UINT32_MAX))
      transpose_gather_kernel<T, uint32_t><<<blocks_for(total), kThreads, 0, st>>>(x, y, total, g);
    else
      transpose_gather_kernel<T, int64_t><<<blocks_for(total), kThreads, 0, st>>>(x, y, total, g);
    check_launch("transpose (gather)");
    return;
  }
  Tiled t{};
  for (int i = 0; i < r - 1; ++i) {
    if (i == q) continue;
    t.outer_dims[t.outer_rank] = od[i];
    t.outer_in[t.outer_rank] = is[s.p[size_t(i)]];
    t.outer_out[t.outer_rank] = os[i];
    ++t.outer_rank;
  }
  t.rows = rows;
  t.cols = cols;
  t.in_col = is[a];
  t.out_row = os[q];
  t.tiles_r = (rows + kTile - 1) / kTile;
  t.tiles_c = (cols + kTile - 1) / kTile;
  t.tiles = total / (rows * cols) * t.tiles_r * t.tiles_c;
  const unsigned grid = unsigned(std::min<int64_t>(t.tiles, int64_t(1) << 20));
  transpose_tiled_kernel<<<grid, dim3(kTile, kTileRowsPerPass), 0, st>>>(x, y, t);
  check_launch("transpose (tiled)");
}

}  // namespace

// x with shape dims (rank) -> y with shape dims[perm[i]]; elem bytes per element (1, 2, 4, 8).
void transpose(const void* x, void* y, const int64_t* dims, const int* perm, int rank, int elem,
               Stream s) {
  std::vector<bool> seen(size_t(std::max(rank, 0)), false);
  int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    if (perm[i] < 0 || perm[i] >= rank || seen[size_t(perm[i])])
      check(cudaErrorInvalidValue, "transpose: perm is not a permutation of the dims");
    seen[size_t(perm[i])] = true;
    total *= dims[i];
  }
  if (total <= 0) return;
  const Perm p = simplify(dims, perm, rank);
  if (p.d.size() <= 1) {  // the identity on memory
    if (x != y)
      check(cudaMemcpyAsync(y, x, size_t(total) * size_t(elem), cudaMemcpyDeviceToDevice, s),
            "transpose (cudaMemcpyAsync)");
    return;
  }
  switch (elem) {
    case 1:
      return transpose_typed(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), p, total, s);
    case 2:
      return transpose_typed(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), p, total,
                             s);
    case 4:
      return transpose_typed(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), p, total,
                             s);
    case 8:
      return transpose_typed(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(y), p, total,
                             s);
  }
  check(cudaErrorInvalidValue, "transpose: element size not in {1,2,4,8}");
}

// x (N, W), W = sum sizes -> ys[i] (N, sizes[i]); elements of elem bytes
void split_last(const void* x, void* const* ys, const int64_t* sizes, int k, int64_t N, int elem,
                Stream s) {
  if (N <= 0) return;
  int64_t W = 0;
  for (int i = 0; i < k; ++i) W += sizes[i];
  const size_t e = size_t(elem), pitch = size_t(W) * e;
  const char* src = static_cast<const char*>(x);
  for (int i = 0; i < k; ++i) {
    const size_t width = size_t(sizes[i]) * e;
    if (width > 0)
      check(cudaMemcpy2DAsync(ys[i], width, src, pitch, width, size_t(N), cudaMemcpyDeviceToDevice,
                              s),
            "split_last (cudaMemcpy2DAsync)");
    src += width;
  }
}

// xs[i] (N, sizes[i]) -> y (N, W), W = sum sizes; elements of elem bytes
void concat_last(const void* const* xs, void* y, const int64_t* sizes, int k, int64_t N, int elem,
                 Stream s) {
  if (N <= 0) return;
  int64_t W = 0;
  for (int i = 0; i < k; ++i) W += sizes[i];
  const size_t e = size_t(elem), pitch = size_t(W) * e;
  char* dst = static_cast<char*>(y);
  for (int i = 0; i < k; ++i) {
    const size_t width = size_t(sizes[i]) * e;
    if (width > 0)
      check(cudaMemcpy2DAsync(dst, pitch, xs[i], width, width, size_t(N), cudaMemcpyDeviceToDevice,
                              s),
            "concat_last (cudaMemcpy2DAsync)");
    dst += width;
  }
}

}  // namespace loom::kernels::cuda
