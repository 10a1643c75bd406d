// The parts of Communicator that are the same for every backend: chunk_bytes and the argument
// checks every public call makes before the backend's do_* method. Not here: moving bytes
// (local.cc, mpi.cc) or cutting collectives into pieces (chunking.cc). Invariant: every check
// throws loom::Error naming the call, never LOOM_CHECK: a bad count, root or peer usually comes
// from a config or a plan, not from a bug in this library.
#include "loom/comm/communicator.h"

#include <fmt/format.h>

#include "loom/core/error.h"

namespace loom::comm {

namespace {
thread_local bool polite = false;
thread_local const std::atomic<int>* waiting = nullptr;
}  // namespace

void set_polite_waits(bool on, const std::atomic<int>* waiters) {
  polite = on;
  waiting = waiters;
}
bool polite_waits() { return polite; }
bool hurried() { return waiting && waiting->load(std::memory_order_relaxed) > 0; }

void Communicator::set_chunk_bytes(int64_t bytes) {
  if (bytes < kMinChunkBytes || bytes > kMaxChunkBytes)
    throw Error(
        fmt::format("chunk_bytes {} is outside {}..{}", bytes, kMinChunkBytes, kMaxChunkBytes),
        "the default is 4 MiB (4194304); pieces must hold one element and fit an MPI count");
  chunk_bytes_ = bytes;
}

void Communicator::set_gather_chunk_bytes(int64_t bytes) {
  if (bytes < kMinChunkBytes || bytes > kMaxChunkBytes)
    throw Error(fmt::format("gather_chunk_bytes {} is outside {}..{}", bytes, kMinChunkBytes,
                            kMaxChunkBytes));
  gather_chunk_bytes_ = bytes;
}

namespace {

void check_count(const char* op, int64_t n) {
  if (n < 0) throw Error(fmt::format("{}: negative size {}", op, n));
}

void check_reduce_dtype(const char* op, DType dt) {
  if (dt != DType::f32 && dt != DType::bf16 && dt != DType::i32)
    throw Error(fmt::format("{}: cannot sum dtype {}", op, int(dt)),
                "reductions take f32, bf16 or i32");
}

void check_peer(const Communicator& c, const char* op, const char* what, int r) {
  if (r < 0 || r >= c.size())
    throw Error(
        fmt::format("{}: {} {} is not a rank of this {}-rank communicator", op, what, r, c.size()));
}

void check_tag(const char* op, int tag) {
  if (tag < 0) throw Error(fmt::format("{}: negative tag {}", op, tag), "tags are >= 0, as in MPI");
}

void check_buffer(const char* op, const void* p, int64_t n) {
  if (n > 0 && p == nullptr) throw Error(fmt::format("{}: null buffer for {} bytes", op, n));
}

}  // namespace

void Communicator::all_reduce(void* buf, int64_t count, DType dt) {
  check_count("all_reduce", count);
  check_reduce_dtype("all_reduce", dt);
  check_buffer("all_reduce", buf, count * int64_t(dtype_size(dt)));
  do_all_reduce(buf, count, dt);
}

void Communicator::all_gather(const void* in, void* out, int64_t bytes) {
  check_count("all_gather", bytes);
  check_buffer("all_gather", in, bytes);
  check_buffer("all_gather", out, bytes);
  do_all_gather(in, out, bytes);
}

void Communicator::reduce_scatter(const void* in, void* out, int64_t count, DType dt) {
  check_count("reduce_scatter", count);
  check_reduce_dtype("reduce_scatter", dt);
  const int64_t bytes = count * int64_t(dtype_size(dt));
  check_buffer("reduce_scatter", in, bytes);
  check_buffer("reduce_scatter", out, bytes);
  do_reduce_scatter(in, out, count, dt);
}

void Communicator::broadcast(void* buf, int64_t bytes, int root) {
  check_count("broadcast", bytes);
  check_peer(*this, "broadcast", "root", root);
  check_buffer("broadcast", buf, bytes);
  do_broadcast(buf, bytes, root);
}

void Communicator::all_to_all(const void* in, void* out, int64_t bytes) {
  check_count("all_to_all", bytes);
  check_buffer("all_to_all", in, bytes);
  check_buffer("all_to_all", out, bytes);
  do_all_to_all(in, out, bytes);
}

void Communicator::send(const void* buf, int64_t bytes, int peer, int tag) {
  check_count("send", bytes);
  check_peer(*this, "send", "peer", peer);
  check_tag("send", tag);
  check_buffer("send", buf, bytes);
  do_send(buf, bytes, peer, tag);
}

void Communicator::recv(void* buf, int64_t bytes, int peer, int tag) {
  check_count("recv", bytes);
  check_peer(*this, "recv", "peer", peer);
  check_tag("recv", tag);
  check_buffer("recv", buf, bytes);
  do_recv(buf, bytes, peer, tag);
}

}  // namespace loom::comm
