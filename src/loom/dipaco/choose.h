// Which DiPaCo path a prompt is sampled from: the one named, or the one the run's router sends the
// prompt to (the base model's features of its first tokens, the nearest centroid: router.h), as
// `loom sample RUN --path N|auto` asks.
//
// Not here: tokenizing (the caller's encode: this room links no tokenizer, as `loom` with its gRPC
// links it too), sampling (infer/sample.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/train/config.h"

namespace loom::dipaco {

struct PathChoice {
  int64_t path = -1;
  bool routed = false;  // chosen by the router (spec "auto"), not by index
  std::string run;      // RUN/path_<p>: the path's run directory
};

// The prompt's tokens as the path run in `run_dir` (with config `cfg`) reads them.
using EncodePrompt =
    std::function<std::vector<int32_t>(const std::string& run_dir, const train::Config& cfg)>;

// RUN is a `loom islands` run of DiPaCo paths (RUN/path_<p>/); spec is "auto" or a path index.
// Throws loom::Error naming the run when it is not a DiPaCo run, or the spec when it names no path.
PathChoice choose_path(const std::string& run, const std::string& spec, const EncodePrompt& encode);

}  // namespace loom::dipaco
