// Pieces of collectives (see chunking.h for the worked example). The temporaries are sized once per
// call, size x (one piece), and only when the per-rank block is over chunk_bytes.
#include "loom/comm/chunking.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace loom::comm {

int64_t piece_units(int64_t unit_bytes, int64_t chunk_bytes) {
  return std::max<int64_t>(1, chunk_bytes / unit_bytes);
}

void for_each_piece(int64_t total, int64_t max_units,
                    const std::function<void(int64_t offset, int64_t n)>& piece) {
  for (int64_t off = 0; off < total; off += max_units) piece(off, std::min(max_units, total - off));
}

void chunked_all_gather(const void* in, void* out, int64_t bytes, int size, int64_t chunk_bytes,
                        const GatherPrimitive& primitive) {
  if (bytes == 0) return;
  if (bytes <= chunk_bytes) return primitive(in, out, bytes);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const int64_t max_n = piece_units(1, chunk_bytes);
  std::vector<char> tmp(size_t(size) * size_t(max_n));
  for_each_piece(bytes, max_n, [&](int64_t off, int64_t n) {
    primitive(src + off, tmp.data(), n);  // tmp: (size, n)
    for (int r = 0; r < size; ++r)
      std::memcpy(dst + r * bytes + off, tmp.data() + r * n, size_t(n));
  });
}

void chunked_reduce_scatter(const void* in, void* out, int64_t count, int64_t elem_bytes, int size,
                            int64_t chunk_bytes, const ReduceScatterPrimitive& primitive) {
  if (count == 0) return;
  if (count * elem_bytes <= chunk_bytes) return primitive(in, out, count);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const int64_t max_n = piece_units(elem_bytes, chunk_bytes);
  const int64_t block = count * elem_bytes;
  std::vector<char> tmp(size_t(size) * size_t(max_n * elem_bytes));
  for_each_piece(count, max_n, [&](int64_t off, int64_t n) {
    const int64_t pb = n * elem_bytes;  // tmp: (size, n) elements
    for (int r = 0; r < size; ++r)
      std::memcpy(tmp.data() + r * pb, src + r * block + off * elem_bytes, size_t(pb));
    primitive(tmp.data(), dst + off * elem_bytes, n);
  });
}

void chunked_all_to_all(const void* in, void* out, int64_t bytes, int size, int64_t chunk_bytes,
                        const AllToAllPrimitive& primitive) {
  if (bytes == 0) return;
  if (bytes <= chunk_bytes) return primitive(in, out, bytes);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const int64_t max_n = piece_units(1, chunk_bytes);
  std::vector<char> tmp_in(size_t(size) * size_t(max_n)), tmp_out(tmp_in.size());
  for_each_piece(bytes, max_n, [&](int64_t off, int64_t n) {
    for (int j = 0; j < size; ++j)
      std::memcpy(tmp_in.data() + j * n, src + j * bytes + off, size_t(n));
    primitive(tmp_in.data(), tmp_out.data(), n);  // (size, n) each
    for (int i = 0; i < size; ++i)
      std::memcpy(dst + i * bytes + off, tmp_out.data() + i * n, size_t(n));
  });
}

}  // namespace loom::comm
