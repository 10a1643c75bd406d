// The run configuration: a TOML file with sections [model], [train], [optim], [data], [checkpoint],
// [plan], [passes] and [outer], overridden from the command line with `--set section.key=value`.
//
// Strict: an unknown section or key, or a value of the wrong type, is a loom::Error naming the file
// and the key (with a "did you mean" hint for near misses). Every key has a default except [model]
// arch, which must be stated. Each room declares its own section (config/schema.h: every key with
// its type, default, range and meaning; models/, data/, shard/, passes/, outer/ with dipaco/'s
// keys); config.cc declares [train], [optim] and [checkpoint] and assembles them all. The loader
// checks each numeric key against its range (the error names the key, the value and the range, and
// says when the value is a default the file never set), then each section's rules, then the rules
// across sections; the key reference (docs/config.md, `loom config --keys`) is printed from the
// same keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/autodiff/autodiff.h"
#include "loom/data/config_section.h"
#include "loom/models/model.h"
#include "loom/outer/config_section.h"
#include "loom/passes/pass.h"
#include "loom/runtime/device.h"
#include "loom/shard/plan.h"

namespace loom::train {

struct TrainConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 256;
  int64_t seed = 0;
  int64_t steps = 1000;
  int64_t warmup_steps = 0;
  double min_lr = 0;       // the cosine schedule decays lr to this at the last step
  int64_t eval_every = 0;  // 0: evaluate only at the end
  int64_t eval_batches = 4;
  int64_t grad_accum = 1;  // micro-batches of batch_size rows per optimizer step
  runtime::DeviceKind device = runtime::DeviceKind::cpu;  // where steps run (backend/backend.h)
};

struct CheckpointConfig {
  int64_t every = 0;  // 0: only at the end
  int64_t keep = 3;
  bool async = false;  // written on a thread from a snapshot while training goes on
};

// [plan]: how the training step is split across ranks (shard/plan.h). No mesh: one process,
// unsplit.
struct PlanConfig {
  shard::Plan plan;           // mesh = { data = 2, model = 2 } (axes in the order written),
                              // tactics = [ { kind = "fsdp", axis = "data" }, ... ]
  std::string ranks = "mpi";  // "mpi": one process per rank (mpirun -np N loom train ...);
                              // "local": N threads of this process
};

struct Config {
  std::string path;  // where it came from, for messages
  models::ModelConfig model;
  TrainConfig train;
  autodiff::AdamWConfig optim;
  data::DataConfig data;
  CheckpointConfig checkpoint;
  outer::OuterConfig outer;
  PlanConfig plan;
  // [passes]: what the compiler does to a plan's per-rank program (passes/pass.h: bucket, ...)
  passes::ScheduleOptions passes;
  // [model] init: weights to start a fresh run from (a .safetensors file, or a directory holding
  // model.safetensors or a sharded index: `loom export`'s output, a checkpoint, a Hugging Face
  // model directory); empty: random init. Ignored when resuming. A directory with a config.json
  // also decides [model] (hf_dir.h).
  std::string init_weights;
  std::string text;  // the resolved config as TOML (with overrides applied), saved in run dirs
};

// Reads and validates `path`, applying overrides of the form "section.key=value" (value in TOML
// syntax; a bare word is taken as a string). What a command reads of a config: everything (train,
// bench, inspect), or only [model] (loom step, which takes the batch and sequence length from its
// tokens): then the other sections' keys are still parsed strictly, but nothing checks them against
// [model].
enum class ConfigUse { all, model_only };
// Every key a config may hold, as "[section] key" ("[model] moe.top_k" for an inline table's),
// in the schema's order.
std::vector<std::string> config_keys();
// The schema as markdown, a table per section: every key with its type, default, range and
// meaning. `loom config --keys` prints it; docs/config.md holds it (config_test keeps them equal).
std::string config_reference();
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   ConfigUse use = ConfigUse::all);

}  // namespace loom::train
