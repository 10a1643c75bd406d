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
  int64_t steps = 1000;
  int64_t warmup_steps = 0;
  double min_lr = 0;        // the cosine schedule decays lr to this at the last step
  int64_t eval_every = 0;   // 0: evaluate only at the end
  int64_t eval_batches = 4;
  int64_t grad_accum = 1;   // micro-batches of batch_size rows per optimizer step
};

struct DataConfig {
  std::string path;  // a text file or a directory of .txt files (byte-level tokens)
};

struct CheckpointConfig {
  int64_t every = 0;  // 0: only at the end
  int64_t keep = 3;
};

struct Config {
  std::string path;  // where it came from, for messages
  models::ModelConfig model;
  TrainConfig train;
  autodiff::AdamWConfig optim;
  DataConfig data;
  CheckpointConfig checkpoint;
  // [model] init: weights to start a fresh run from (a model.safetensors, or a directory holding one,
  // such as `loom export`'s output); empty: random init. Ignored when resuming.
  std::string init_weights;
  std::string text;  // the resolved config as TOML (with overrides applied), saved in run dirs
};

// Reads and validates `path`, applying overrides of the form "section.key=value" (value in TOML syntax;
// a bare word is taken as a string).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace loom::train
