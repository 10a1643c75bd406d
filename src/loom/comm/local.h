// The local backend: the ranks are threads of one process and a collective reads the other ranks'
// buffers directly. For tests, for tactics on one machine, and as the reference the MPI backend is
// checked against.
//
// How a collective step runs (local.cc): each rank publishes its buffer pointers in its slot of the
// communicator, waits at a barrier, reads what it needs from the other slots and writes only its
// own output, then waits at a second barrier so that no rank returns (and frees or reuses its
// buffer) while another may still read it. The barriers are generation-counted, under one mutex and
// condition variable per world (no spinning: tests run 4 ranks on 2 cores). Reductions sum each
// element in rank order 0,1,2,..., so every rank gets the same bits, whatever the chunk size.
// send/recv go through a mailbox keyed by (communicator, src, dst, tag): send copies and returns,
// recv blocks.
//
// Not here: shared-memory tricks across processes, asynchronous calls.
//
// Failure (key invariant): no rank hangs because another failed. LocalWorld::abort(why) makes every
// rank blocked in, or later entering, a collective or recv of this world or of any communicator
// split from it throw loom::Error("rank R aborted: why"). A rank whose Communicator is destroyed
// has left: ranks waiting for it throw too. Each call also checks that all ranks made the same call
// (op, sizes, dtype, root, chunk size) and throws on every rank if not.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "loom/comm/communicator.h"

namespace loom::comm {

namespace detail {
struct LocalWorldState;
struct LocalGroup;
}  // namespace detail

class LocalWorld {
 public:
  explicit LocalWorld(int n);  // n >= 1 ranks
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;
  ~LocalWorld();

  int size() const;
  // The communicator of `rank` (0 <= rank < n), at most once per rank; it may outlive the
  // LocalWorld. Hand each to its own thread: a collective returns only when every rank has called
  // it.
  std::unique_ptr<Communicator> communicator(int rank);
  // Makes every collective and recv of this world, pending or later, throw (see above).
  // Thread-safe; the first `why` is kept.
  void abort(const std::string& why);

 private:
  std::shared_ptr<detail::LocalWorldState> world_;
  std::shared_ptr<detail::LocalGroup> root_;
};

// Runs fn on n threads, each with the communicator of its rank, and joins them. When fn throws on a
// rank, the world is aborted (so the other ranks stop instead of hanging) and, once all threads
// have ended, run_local throws loom::Error("rank R: <message>") for the first rank that failed of
// its own accord (not because another one did).
void run_local(int n, const std::function<void(Communicator&)>& fn);

}  // namespace loom::comm
