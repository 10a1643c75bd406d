#include "loom/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace loom::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* cond) {
  os_ << file << ":" << line << ": internal check failed: " << cond << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace loom::detail
