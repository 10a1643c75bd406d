// The run configuration: a TOML file with sections [model], [train], [optim], [data], [checkpoint],
// [outer] and [plan], overridden from the
// command line with `--set section.key=value`.
//
// Strict: an unknown section or key, or a value of the wrong type, is a loom::Error naming the file
// and the key (with a "did you mean" hint for near misses). Every key has a default except [model]
// arch, which must be stated. One schema (config.cc) declares every key with its type, default,
// range and meaning: the loader checks each numeric key against its range (the error names the
// key, the value and the range, and says when the value is a default the file never set), and the
// key reference (docs/config.md, `loom config --keys`) is printed from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/autodiff/autodiff.h"
#include "loom/models/model.h"
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

struct DataConfig {
  std::string path;  // a text file or a directory of .txt files (byte-level tokens)
};

struct CheckpointConfig {
  int64_t every = 0;  // 0: only at the end
  int64_t keep = 3;
};

// [outer] mode: how the outer server applies pushes (src/loom/outer/rounds.h). sync: in rounds that
// close when every expected island has pushed; async: each push at once (Delayed Nesterov).
enum class OuterMode { sync, async };
// "sync" | "async": the one spelling in configs, on the wire (JoinReply.mode) and in state files.
const char* outer_mode_name(OuterMode m);

// [outer]: the island's side of DiLoCo / asynchronous Local-SGD (src/loom/outer/), and the settings
// `loom outer-server` reads from the same file. Empty `server`: no outer loop.
struct OuterConfig {
  std::string server;  // host:port of loom outer-server
  OuterMode mode = OuterMode::sync;
  int64_t inner_steps = 50;  // H: inner steps between pushes
  double lr = 0.7;           // outer Nesterov learning rate
  double momentum = 0.9;
  std::string compress = "f32";  // pseudo-gradients pushed as "f32", "bf16", "int8" or "int4"
  // sync, streaming DiLoCo (outer/fragments.h): the model's fragments, each synced every H steps
  // at staggered offsets; an island goes on `overlap` inner steps after pushing a fragment before
  // it takes the round's result, which it mixes in as mix x local + (1 - mix) x global
  int64_t fragments = 1;
  int64_t overlap = 0;
  double mix = 0;
  // sync, DiPaCo (outer/paths.h): modules per level (empty: not DiPaCo), the path this island
  // trains, and the directory `loom dipaco route` wrote (`loom islands` gives each island a path
  // and that path's data from it)
  std::vector<int64_t> modules;
  int64_t path = 0;
  std::string router;
  // DiPaCo's paths: the product of `modules`, 0 without
  int64_t paths() const {
    if (modules.empty()) return 0;
    int64_t n = 1;
    for (int64_t m : modules) n *= m;
    return n;
  }
  int64_t delay = 0;  // async: Delayed Nesterov period; 0: the live islands
  // async: after a push, how long an island waits for the rest of its Delayed Nesterov period
  // before it pulls, as a fraction of its own round's time (0: it never waits)
  double grace = 2;
  int64_t islands = 0;  // islands expected (async step budget = islands x [train] steps)
  double lease_s = 10;
  double retry_s = 120;    // how long an island keeps reconnecting to a server that is gone
  std::string token_file;  // else the LOOM_OUTER_TOKEN environment variable
  std::string tls_ca;      // island: PEM to trust; server: tls_cert + tls_key
  std::string tls_cert, tls_key;
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
  DataConfig data;
  CheckpointConfig checkpoint;
  OuterConfig outer;
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
