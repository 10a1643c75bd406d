#include "loom/runtime/comm_stream.h"

#include "loom/comm/communicator.h"

namespace loom::runtime {

CommStream::CommStream(bool hurry) : hurry_(hurry), thread_([this] { loop(); }) {}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (idle())
    thread_.join();
  else
    thread_.detach();  // a collective still blocked on a peer: see the header
}

int64_t CommStream::submit(std::function<void()> task) {
  int64_t ticket;
  {
    std::lock_guard<std::mutex> l(mu_);
    ticket = ++submitted_;
    if (error_)  // after a failure: dropped at once (its peers are failing too), never queued
      done_ = submitted_;
    else
      queue_.emplace_back(ticket, std::move(task));
  }
  cv_.notify_all();
  return ticket;
}

void CommStream::wait(int64_t ticket) {
  std::unique_lock<std::mutex> l(mu_);
  auto ready = [&] { return done_ >= ticket || error_; };
  if (!ready()) {  // blocked: this thread's core is free, the stream may poll flat out
    waiters_.fetch_add(1, std::memory_order_relaxed);
    cv_.wait(l, ready);
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (error_) std::rethrow_exception(error_);
}

bool CommStream::idle() {
  std::lock_guard<std::mutex> l(mu_);
  return done_ == submitted_ && queue_.empty();
}

void CommStream::loop() {
  // this thread shares the rank's cores with its compute: it sleeps between polls, unless the
  // compute thread is blocked in wait() (communicator.h)
  comm::set_polite_waits(true, hurry_ ? &waiters_ : nullptr);
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front().second);
      queue_.pop_front();
      if (error_) {  // submitted after a failure: dropped too
        done_ = submitted_;
        continue;
      }
    }
    std::exception_ptr e;
    try {
      task();
    } catch (...) {
      e = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (e) {  // what follows a failed collective is dropped: its peers are failing too
        error_ = e;
        queue_.clear();
        done_ = submitted_;
      } else {
        ++done_;
      }
    }
    cv_.notify_all();
  }
}

}  // namespace loom::runtime
