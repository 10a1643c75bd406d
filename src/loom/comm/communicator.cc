// The parts of Communicator that are the same for every backend: chunk_bytes and argument checks.
// Not here: moving bytes (local.cc, mpi.cc) or cutting collectives into pieces (chunking.cc).
// Invariant: every check throws loom::Error naming the call, never LOOM_CHECK: a bad count, root or
// peer usually comes from a config or a plan, not from a bug in this library.
#include "loom/comm/communicator.h"

#include <fmt/format.h>

#include "loom/core/error.h"

namespace loom::comm {

void Communicator::set_chunk_bytes(int64_t bytes) {
  if (bytes < kMinChunkBytes || bytes > kMaxChunkBytes)
    throw Error(fmt::format("chunk_bytes {} is outside {}..{}", bytes, kMinChunkBytes, kMaxChunkBytes),
                "the default is 4 MiB (4194304); pieces must hold one element and fit an MPI count");
  chunk_bytes_ = bytes;
}

void Communicator::set_gather_chunk_bytes(int64_t bytes) {
  if (bytes < kMinChunkBytes || bytes > kMaxChunkBytes)
    throw Error(fmt::format("gather_chunk_bytes {} is outside {}..{}", bytes, kMinChunkBytes,
                            kMaxChunkBytes));
  gather_chunk_bytes_ = bytes;
}

namespace detail {

void check_count(const char* op, int64_t n) {
  if (n < 0) throw Error(fmt::format("{}: negative size {}", op, n));
}

void check_reduce_dtype(const char* op, DType dt) {
  if (dt != DType::f32 && dt != DType::bf16 && dt != DType::i32)
    throw Error(fmt::format("{}: cannot sum dtype {}", op, int(dt)), "reductions take f32, bf16 or i32");
}

void check_peer(const Communicator& c, const char* op, const char* what, int r) {
  if (r < 0 || r >= c.size())
    throw Error(fmt::format("{}: {} {} is not a rank of this {}-rank communicator", op, what, r,
                            c.size()));
}

void check_tag(const char* op, int tag) {
  if (tag < 0) throw Error(fmt::format("{}: negative tag {}", op, tag), "tags are >= 0, as in MPI");
}

void check_buffer(const char* op, const void* p, int64_t n) {
  if (n > 0 && p == nullptr) throw Error(fmt::format("{}: null buffer for {} bytes", op, n));
}

}  // namespace detail

}  // namespace loom::comm
