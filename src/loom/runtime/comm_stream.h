// CommStream: a rank's communication thread. The executor hands it collectives in program order
// and goes on computing; it meets them again only at their waits (ops/collective.cc: wait). Every
// rank submits the same collectives in the same order (SPMD), and one thread runs them first in,
// first out, so the order each communicator sees is the program's on every rank.
//
// Threading: while a collective runs here the compute thread makes no communication call (the
// executor sends every collective of a program through the stream once one is asynchronous), so
// MPI needs MPI_THREAD_SERIALIZED (comm/mpi.cc asks for it and checks it at start).
//
// Failure: a collective that throws (a peer aborted: local.h; a checked argument) is rethrown by
// its wait() on the compute thread. A stream must not be destroyed while a collective is still
// blocked on a peer (a peer died mid-step and an error is unwinding the compute thread): its thread
// would outlive the stream's members. Its owner leaks it instead, with the buffers the collective
// may still touch (runtime::Executor's destructor does; the process is ending: ranks.cc), and the
// destructor, should it be reached busy all the same, detaches rather than hangs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace loom::runtime {

class CommStream {
 public:
  // hurry: whether the stream's thread may poll flat out while the compute thread is blocked in
  // wait() (communicator.h: set_polite_waits) — right where the rank has its cores to itself, so
  // that a blocked compute thread leaves one idle (Executor: cores_to_spare).
  explicit CommStream(bool hurry = true);
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `task`; returns its ticket (1, 2, ... in submission order).
  int64_t submit(std::function<void()> task);
  // Blocks until the task of `ticket` (and every earlier one) has run. Once a task has thrown, the
  // tasks queued behind it, and any submitted later, are dropped and every wait() rethrows that
  // exception.
  void wait(int64_t ticket);
  // wait() for everything submitted; the stream is idle after.
  void drain() { wait(submitted_); }
  // Whether everything submitted has run (or been dropped after a failure).
  bool idle();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, std::function<void()>>> queue_;
  int64_t submitted_ = 0, done_ = 0;
  std::exception_ptr error_;  // the first failure (sticky)
  bool stop_ = false;
  const bool hurry_;
  std::atomic<int> waiters_{0};  // threads blocked in wait(): the stream need not be polite
  std::thread thread_;
  void loop();
};

}  // namespace loom::runtime
