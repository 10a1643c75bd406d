// Cutting a collective into pieces of at most chunk_bytes, for the backends. Each helper calls the
// backend's one-shot primitive once per piece, in order, on every rank the same way.
//
// Worked example: all_gather of bytes = 10 per rank over 3 ranks with chunk_bytes = 4. The per-rank
// block is cut at offsets 0, 4, 8 (pieces 4, 4, 2). For the piece at offset 4 every rank passes
// in[4..8) to the primitive, which fills a temporary (3 ranks x 4 bytes); the helper copies rank
// r's 4 bytes to out[r*10 + 4 .. r*10 + 8). reduce_scatter gathers the strided input pieces into a
// temporary the same way; all_to_all does both.
//
// Not here: moving bytes (the primitive does), argument checks (communicator.h).
// Invariant: a payload of at most chunk_bytes is one call on the caller's own buffers (no copy);
// pieces are whole elements, so an element-wise reduction gives the same result whatever the chunk
// size.
#pragma once

#include <cstdint>
#include <functional>

namespace loom::comm {

// Elements (of unit_bytes each) per piece: chunk_bytes / unit_bytes, at least 1.
int64_t piece_units(int64_t unit_bytes, int64_t chunk_bytes);

// Calls piece(offset, n) for consecutive [offset, offset + n) covering [0, total), n <= max_units.
// Nothing when total == 0.
void for_each_piece(int64_t total, int64_t max_units,
                    const std::function<void(int64_t offset, int64_t n)>& piece);

// primitive(in, out, bytes): the backend's all_gather of `bytes` per rank. in: (bytes,)
// out: (size, bytes)
using GatherPrimitive = std::function<void(const void* in, void* out, int64_t bytes)>;
void chunked_all_gather(const void* in, void* out, int64_t bytes, int size, int64_t chunk_bytes,
                        const GatherPrimitive& primitive);

// primitive(in, out, count): the backend's reduce_scatter of `count` elements per rank.
// in: (size, count) elements of elem_bytes  out: (count,)
using ReduceScatterPrimitive = std::function<void(const void* in, void* out, int64_t count)>;
void chunked_reduce_scatter(const void* in, void* out, int64_t count, int64_t elem_bytes, int size,
                            int64_t chunk_bytes, const ReduceScatterPrimitive& primitive);

// primitive(in, out, bytes): the backend's all_to_all of `bytes` per block. in, out: (size, bytes)
using AllToAllPrimitive = std::function<void(const void* in, void* out, int64_t bytes)>;
void chunked_all_to_all(const void* in, void* out, int64_t bytes, int size, int64_t chunk_bytes,
                        const AllToAllPrimitive& primitive);

}  // namespace loom::comm
