// Wall time as Loom measures it: seconds on the steady clock since one of its points.
#pragma once

#include <chrono>

namespace loom {

// Seconds from `t` to now.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace loom
