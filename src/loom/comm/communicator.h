// Communicator: the one interface every parallel tactic talks to, whatever moves the bytes (threads
// of one process: local.h; processes under mpirun: mpi.h).
//
// What it does: the collectives a training step needs (all_reduce, all_gather, reduce_scatter,
// broadcast, all_to_all, barrier), buffered point-to-point send and blocking recv, and split into
// sub-communicators (a mesh's rows and columns). Every call is blocking and collective calls must
// be made by every rank of the communicator, in the same order, with the same
// count/bytes/dtype/root and the same chunk_bytes. Buffers are host memory; `in` and `out` must not
// overlap. What it does not: no asynchronous handles, no streams, no device memory, no averaging
// (callers scale), no error recovery (an error on one rank ends the job; see docs/comm.md).
//
// Key invariants:
//  - a reduction gives bit-identical results on every rank; the local backend sums each element in
//    rank order 0,1,2,... (bf16 accumulated in f32 and rounded once), so its results are also
//    independent of the chunk size;
//  - a payload over chunk_bytes() (for all_gather, reduce_scatter, all_to_all: the per-rank block)
//    moves in pieces of at most chunk_bytes(); the result is the same whatever the chunk size.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/core/dtype.h"

namespace loom::comm {

// 4 MiB: measured on the 2-core dev machine, Open MPI's reduce-scatter runs at 3.4 GB/s with 8 MiB
// messages and 1.4 GB/s with 16 MiB ones; smaller pieces also bound the temporary buffers.
constexpr int64_t kDefaultChunkBytes = int64_t(4) << 20;
// Bounds for set_chunk_bytes: a piece holds at least one element of any dtype, and every MPI count
// (an int) fits.
constexpr int64_t kMinChunkBytes = 4;
constexpr int64_t kMaxChunkBytes = int64_t(1) << 30;

// Waiting without spinning, per thread: a thread whose cores are shared with computation (a rank's
// communication thread, runtime/comm_stream.h) sets it, and the backends then wait for a
// collective by sleeping between polls (mpi: a non-blocking call, MPI_Test, sleeps that grow to
// 100 us) instead of polling flat out, which would take a core from the rank's compute. The local
// backend always sleeps on a condition variable. Off by default.
// `waiters`, if given, counts the threads blocked until this thread's work is done (the compute
// thread at a wait: runtime/comm_stream.h): while it is above 0 their cores are idle, and a polite
// thread polls flat out (hurried()) — sleeping then only delays the collective they wait for
// (megatron on 2 ranks: each 4 MiB all_reduce 2.0 -> 1.6 ms, the waits a step 91 -> 45 ms:
// docs/comm.md).
void set_polite_waits(bool on, const std::atomic<int>* waiters = nullptr);
bool polite_waits();
bool hurried();

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every call below checks its arguments (a loom::Error naming the call) and then hands over to
  // the backend's do_* method. Sum over all ranks, in place. dt is f32, bf16 (summed in f32,
  // rounded once at the end) or i32 (exact while no partial sum overflows). buf: (count,)
  void all_reduce(void* buf, int64_t count, DType dt);
  // out = the `bytes` bytes of `in` from every rank, concatenated in rank order (out holds
  // size()*bytes).
  void all_gather(const void* in, void* out, int64_t bytes);
  // in: size() blocks of `count` elements (rank-major); out (count elements) = sum over ranks of
  // their block number rank().  in: (size, count)  out: (count,)
  void reduce_scatter(const void* in, void* out, int64_t count, DType dt);
  void broadcast(void* buf, int64_t bytes, int root);
  // in: size() blocks of `bytes`, block j is sent to rank j; out: size() blocks, block i came from
  // rank i.
  void all_to_all(const void* in, void* out, int64_t bytes);
  // tag >= 0. A message is received by the recv with the same (peer, tag) and the same `bytes`,
  // in the order sent. send is buffered: it returns once `buf` may be reused, whether or not the
  // peer has posted its recv (local: the message is copied into the peer's mailbox; mpi: copied
  // and sent non-blocking, completed by later calls or when the communicator ends), so two ranks
  // may send to each other before either receives. recv blocks until the message is there.
  void send(const void* buf, int64_t bytes, int peer, int tag);
  void recv(void* buf, int64_t bytes, int peer, int tag);
  virtual void barrier() = 0;
  // Collective over this communicator: ranks passing the same color form a new communicator, ranked
  // by (key, old rank) (MPI_Comm_split semantics). A negative color (MPI_UNDEFINED) joins none: the
  // call returns nullptr on that rank. The new communicator starts with this one's chunk_bytes().
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  virtual std::string backend() const = 0;  // "local" | "mpi"
  // Whether two threads may each run a call at once on two different communicators of this world
  // (a rank's communication streams, its host's and the network's: runtime/executor.h). The local
  // backend always may; MPI where it provides MPI_THREAD_MULTIPLE.
  virtual bool concurrent_groups() const { return true; }
  // Whether this communicator's ranks are on more than one host, so that its calls cross the
  // network; the same on every rank. Never for the local backend (threads of one process); MPI
  // compares its ranks' processor names when the communicator is made.
  virtual bool spans_hosts() const { return false; }
  // How many of this communicator's ranks are on this rank's host (the processes that share its
  // cores), this one included. The local backend's are all its threads; MPI counts its ranks'
  // processor names equal to this rank's.
  virtual int host_ranks() const { return size(); }

  // The largest piece one collective moves at a time, in bytes (per rank block for reduce_scatter
  // and all_to_all). Must be equal on every rank of the communicator.
  int64_t chunk_bytes() const { return chunk_bytes_; }
  // Throws loom::Error unless kMinChunkBytes <= bytes <= kMaxChunkBytes.
  void set_chunk_bytes(int64_t bytes);
  // all_gather's own bound (per rank block), kMaxChunkBytes unless set: measured with Open MPI on
  // the 2-core machine (bench/comm_bench.cc, 2 ranks), a 16 MiB all_gather in 4 MiB pieces through
  // a temporary runs at 3.8-4.3 GB/s and in one call at 7.4-7.9 GB/s, while reduce_scatter is the
  // other way round (1.5-1.6 GB/s in pieces, 1.0-1.1 in one call). Across hosts the MPI backend
  // bounds all_gather by chunk_bytes() too, to stay within TCP's eager limit (docs/comm.md).
  int64_t gather_chunk_bytes() const { return gather_chunk_bytes_; }
  void set_gather_chunk_bytes(int64_t bytes);

 protected:
  explicit Communicator(int64_t chunk_bytes = kDefaultChunkBytes) { set_chunk_bytes(chunk_bytes); }
  // The backend's collectives, called with checked arguments.
  virtual void do_all_reduce(void* buf, int64_t count, DType dt) = 0;
  virtual void do_all_gather(const void* in, void* out, int64_t bytes) = 0;
  virtual void do_reduce_scatter(const void* in, void* out, int64_t count, DType dt) = 0;
  virtual void do_broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void do_all_to_all(const void* in, void* out, int64_t bytes) = 0;
  virtual void do_send(const void* buf, int64_t bytes, int peer, int tag) = 0;
  virtual void do_recv(void* buf, int64_t bytes, int peer, int tag) = 0;

 private:
  int64_t chunk_bytes_ = kDefaultChunkBytes;
  int64_t gather_chunk_bytes_ = kMaxChunkBytes;
};

}  // namespace loom::comm
