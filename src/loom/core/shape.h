// Static tensor shapes: a list of non-negative dims, row-major. A scalar has shape [].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s);  // "[4,64,256]"

}  // namespace loom
