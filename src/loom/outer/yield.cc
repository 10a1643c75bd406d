#include "loom/outer/yield.h"

#include <dirent.h>
#include <fmt/format.h>
#include <omp.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace loom::outer {

namespace {

std::atomic<bool> failed{false};
int normal_policy = SCHED_OTHER;  // the process's, set by can_idle()'s probe

int set_policy(int tid, int policy) {
  sched_param p{};  // priority 0: the only one SCHED_IDLE, SCHED_OTHER and SCHED_BATCH take
  return sched_setscheduler(tid, policy, &p) == 0 ? 0 : errno;
}

void fail(const char* what, int err) {
  if (!failed.exchange(true))
    fmt::print(stderr,
               "warning: [outer] yield: {} failed ({}); this island no longer yields its cores\n",
               what, std::strerror(err));
}

}  // namespace

bool can_idle() {
  static const bool can = [] {
    const int policy = sched_getscheduler(0);
    if (policy != SCHED_OTHER && policy != SCHED_BATCH) return false;  // idle or real-time
    normal_policy = policy;
    bool ok = false;  // a new thread has the caller's policy and nice value
    std::thread probe(
        [&ok, policy] { ok = set_policy(0, SCHED_IDLE) == 0 && set_policy(0, policy) == 0; });
    probe.join();
    return ok;
  }();
  return can;
}

bool set_compute_idle() {
  if (!can_idle() || failed) return false;
  int err = 0;  // the calling thread is thread 0 of the team
#pragma omp parallel
  {
    if (const int e = set_policy(0, SCHED_IDLE)) {
#pragma omp critical(loom_outer_yield)
      err = e;
    }
  }
  if (err) {
    fail("setting the compute threads to idle CPU priority", err);
    restore_compute();
    return false;
  }
  return true;
}

void restore_compute() {
  if (!can_idle()) return;
  DIR* d = opendir("/proc/self/task");
  if (!d) {
    fail("listing the process's threads (/proc/self/task)", errno);
    set_policy(0, normal_policy);
    return;
  }
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long tid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end) continue;                    // "." and ".."
    if (sched_getscheduler(int(tid)) != SCHED_IDLE) continue;  // never idle, or gone (-1)
    if (const int err = set_policy(int(tid), normal_policy); err && err != ESRCH)
      fail("setting a thread back to normal CPU priority", err);
  }
  closedir(d);
}

}  // namespace loom::outer
