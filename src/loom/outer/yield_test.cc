// An island's compute threads at idle CPU priority and back (yield.h).
#include "loom/outer/yield.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>

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

TEST(Yield, ComputeThreadsGoIdleAndComeBack) {
  omp_set_num_threads(3);  // a team beside the calling thread, however many cores
  for (int p : policies()) ASSERT_EQ(p, SCHED_OTHER);
  if (!can_idle()) {
    // a process that may not leave SCHED_IDLE never enters it
    EXPECT_FALSE(set_compute_idle(true));
    for (int p : policies()) EXPECT_EQ(p, SCHED_OTHER);
    GTEST_SKIP() << "this process may not leave SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE 0)";
  }
  ASSERT_TRUE(set_compute_idle(true));
  for (int p : policies()) EXPECT_EQ(p, SCHED_IDLE);
  ASSERT_TRUE(set_compute_idle(false));
  for (int p : policies()) EXPECT_EQ(p, SCHED_OTHER);
}

}  // namespace
}  // namespace loom::outer
