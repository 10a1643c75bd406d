// Shared pieces of Loom's fuzz targets (fuzz/targets/*.cc, one reader of untrusted bytes each).
//
// A target turns libFuzzer's bytes into the input its reader takes (a file, a directory, a
// stream of messages) and calls the reader as Loom does. The contract it checks is
// docs/errors.md's: whatever the bytes, the reader returns or throws loom::Error; anything else (a
// crash, an abort, a sanitizer report, another exception type, a hang or runaway memory) is a
// finding. `guard` encodes that: it swallows loom::Error and lets everything else escape, which
// libFuzzer reports with the input that caused it.
//
// Built two ways (fuzz/CMakeLists.txt): with clang's libFuzzer and sanitizers (LOOM_FUZZ=ON, CTest
// label `fuzz`), and in the normal build linked to replay.cc, which runs every seed and regression
// input in fuzz/corpus/ and fuzz/regressions/ as a unit test.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "loom/core/error.h"

namespace loom::fuzz {

// A private scratch directory for this process, removed at exit. (The path is never destroyed:
// the exit handler that removes the directory runs after static destructors would have.)
inline const std::string& scratch_dir() {
  static const std::string* const dir = [] {
    namespace fs = std::filesystem;
    fs::path d = fs::temp_directory_path() / ("loom-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    auto* s = new std::string(d.string());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*dir, ec);
    });
    return s;
  }();
  return *dir;
}

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string put_file(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();  // the harness itself failed: not a finding about Loom
  }
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs f; a loom::Error is the clear refusal the contract allows, anything else escapes.
template <class F>
void guard(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

}  // namespace loom::fuzz
