// An island's compute threads at idle CPU priority and back (yield.h).
#include "loom/outer/yield.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>
#include <sys/resource.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::outer {
namespace {

// The policy of the calling thread and of each thread of OpenMP's team.
std::vector<int> policies() {
  std::vector<int> p(size_t(omp_get_max_threads()) + 1, -1);
  p[0] = sched_getscheduler(0);
#pragma omp parallel
  p[size_t(omp_get_thread_num()) + 1] = sched_getscheduler(0);
  return p;
}

// What can_idle() must find, worked out otherwise: CAP_SYS_NICE (bit 23 of CapEff), or an
// RLIMIT_NICE that allows this thread's nice value.
bool may_leave_idle() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("CapEff:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) >> 23) & 1)
      return true;
  rlimit r{};
  getrlimit(RLIMIT_NICE, &r);
  return r.rlim_cur != RLIM_INFINITY ? rlim_t(20 - getpriority(PRIO_PROCESS, 0)) <= r.rlim_cur
                                     : true;
}

TEST(Yield, ComputeThreadsGoIdleAndEveryIdleThreadComesBack) {
  omp_set_num_threads(3);  // a team beside the calling thread, however many cores
  for (int p : policies()) ASSERT_EQ(p, SCHED_OTHER);
  ASSERT_EQ(can_idle(), may_leave_idle());
  if (!can_idle()) {  // a process that may not leave SCHED_IDLE never enters it
    EXPECT_FALSE(set_compute_idle());
    for (int p : policies()) EXPECT_EQ(p, SCHED_OTHER);
    return;
  }
  ASSERT_TRUE(set_compute_idle());
  for (int p : policies()) EXPECT_EQ(p, SCHED_IDLE);
  // a thread made meanwhile inherits SCHED_IDLE; restore_compute() brings it back too
  std::mutex m;
  std::condition_variable cv;
  bool started = false, restored = false;
  int born = -1, after = -1;
  std::thread t([&] {
    std::unique_lock<std::mutex> l(m);
    born = sched_getscheduler(0);
    started = true;
    cv.notify_all();
    cv.wait(l, [&] { return restored; });
    after = sched_getscheduler(0);
  });
  {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return started; });
  }
  restore_compute();
  {
    std::lock_guard<std::mutex> l(m);
    restored = true;
  }
  cv.notify_all();
  t.join();
  EXPECT_EQ(born, SCHED_IDLE);
  EXPECT_EQ(after, SCHED_OTHER);
  for (int p : policies()) EXPECT_EQ(p, SCHED_OTHER);
}

}  // namespace
}  // namespace loom::outer
