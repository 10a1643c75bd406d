// loom::Error and LOOM_CHECK: the two ways Loom reports that something is wrong.
//
// Error is for bad user input (configs, files, CLI flags): it carries a message naming the file,
// key or tensor and an optional "hint:" line; main() catches it once, prints it and exits non-zero.
// LOOM_CHECK is for internal invariants only: it aborts with file:line. Never use it on user input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, const std::string& hint = "")
      : std::runtime_error(hint.empty() ? what : what + "\nhint: " + hint) {}
};

namespace detail {
// Collects a streamed message, then aborts in its destructor (LOOM_CHECK) or throws (LOOM_ERROR).
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond);
  [[noreturn]] ~CheckFailure();
  template <class T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace detail

}  // namespace loom

#define LOOM_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::loom::detail::CheckFailure(__FILE__, __LINE__, #cond)
