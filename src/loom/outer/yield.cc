#include "loom/outer/yield.h"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "loom/core/error.h"

namespace loom::outer {

namespace {

int set_policy(bool idle) {
  sched_param p{};  // priority 0: the only one SCHED_IDLE and SCHED_OTHER take
  return sched_setscheduler(0, idle ? SCHED_IDLE : SCHED_OTHER, &p) == 0 ? 0 : errno;
}

}  // namespace

bool can_idle() {
  static const bool can = [] {
    bool ok = false;
    std::thread probe([&ok] { ok = set_policy(true) == 0 && set_policy(false) == 0; });
    probe.join();
    return ok;
  }();
  return can;
}

bool set_compute_idle(bool idle) {
  if (!can_idle()) return false;
  int err = set_policy(idle);
#pragma omp parallel
  {
    if (const int e = set_policy(idle)) {
#pragma omp critical(loom_outer_yield)
      err = e;
    }
  }
  if (err)
    throw Error(fmt::format("setting the island's compute threads to {} CPU priority: {}",
                            idle ? "idle" : "normal", std::strerror(err)));
  return true;
}

}  // namespace loom::outer
