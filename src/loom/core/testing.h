// For tests: the message of the loom::Error a call throws, so that a test can check what an error
// names.
#pragma once

#include <string>
#include <utility>

#include "loom/core/error.h"

namespace loom {

// What f() throws as a loom::Error, or "" when it returns (anything else propagates).
template <class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace loom
