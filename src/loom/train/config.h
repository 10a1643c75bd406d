// The run configuration: a TOML file with sections [model], [train], [optim], overridden from the
// command line with `--set section.key=value`.
//
// Strict: an unknown section or key, or a value of the wrong type, is a loom::Error naming the file and
// the key (with a "did you mean" hint for near misses). Every key has a default except [model] arch,
// which must be stated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/autodiff/autodiff.h"
#include "loom/models/model.h"

namespace loom::train {

struct TrainConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 256;
  int64_t seed = 0;
};

struct Config {
  std::string path;  // where it came from, for messages
  models::ModelConfig model;
  TrainConfig train;
  autodiff::AdamWConfig optim;
};

// Reads and validates `path`, applying overrides of the form "section.key=value" (value in TOML syntax;
// a bare word is taken as a string).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace loom::train
