// The training loop: a config becomes a run directory of metrics, checkpoints and the resolved
// config, trained by one rank (or every rank of a plan, each calling train_rank with its
// communicators). `loom train` parses flags and prints; tests call the same functions.
//
// The run directory holds config.toml (the resolved config), metrics.jsonl (one JSON object per
// step: step, loss, lr, grad_norm, tokens_per_s, elapsed_s since this process started training, and
// val_loss when evaluated) and checkpoints/. A resumed run (RunOptions::resume) continues from the
// newest checkpoint that loads whole (a damaged one is passed over, saying so) and rewrites the
// metrics after it, so it logs what a straight run does; a metrics line it cannot parse is kept.
// The writer holds the directory's lock (DirLock, RUN_DIR/.lock) for the whole run: a second run on
// it stops before reading or writing anything there. Every metrics line's write is checked (a full
// disk ends the run with the file named) and made durable at each checkpoint and at the end.
//
// With an OuterSync (an island of DiLoCo / asynchronous Local-SGD, outer/island.h) the run samples
// its own data stream (rank = its island id - 1) and every H steps syncs; those steps' metrics add
// the sync's own (outer_round, outer_version, bytes_sent, bytes_received, wait_s).
//
// Not here: starting ranks (tools/loom/ranks.h), the outer service (outer/). Invariant: only the
// writer (rank 0, or the one process) touches the run directory; every rank computes every step,
// gather and evaluation (they are collective under a plan).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loom/core/file.h"
#include "loom/data/text_corpus.h"
#include "loom/runtime/collectives.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::train {

// The outer optimiser a run syncs with (implemented by outer::Island; the loop does not know gRPC).
// The lr schedule's clock of an island that shares one with the other islands (async with a step
// budget, outer/island.h): the schedule stood at step `at` when the island had taken `t` inner
// steps, and moves `rate` schedule steps per inner step of this island; `now`: its inner steps at
// its last sync. Off: the island's own steps.
struct ScheduleClock {
  bool on = false;
  double at = 0, rate = 1;
  int64_t t = 0, now = 0;
};
// The schedule step of the loop's `step`, `since` steps after the last sync: `step` when the clock
// is off, else the clock's reading for that step (at least 1).
int64_t clocked_step(const ScheduleClock& c, int64_t step, int64_t since);

class OuterSync {
 public:
  virtual ~OuterSync() = default;
  virtual uint64_t id() const = 0;          // counts from 1
  virtual int64_t inner_steps() const = 0;  // H for the round under way
  // Called once inner_steps() steps have passed since the last call (they took `seconds`), and
  // on the run's `last` step: push, wait and pull what is due; false once the budget is spent.
  virtual bool sync(int64_t steps, double seconds, bool last) = 0;
  virtual nlohmann::json metrics() const = 0;  // merged into the metrics line of a sync step
  virtual ScheduleClock clock() const { return {}; }
  virtual std::string summary() const = 0;  // one line for the end of the run
  // `hook(writes)` runs within sync() before the island first reads the ParamStore's parameters,
  // and before each change it makes to them (writes = true): where the parameters live elsewhere
  // (a plan's ranks, a GPU) the hook brings them into the store, and learns they must go back. A
  // sync() that touches no parameter (an async island's look at a push still awaited) then moves
  // none. Null: none. Called on sync()'s thread.
  virtual void on_params(std::function<void(bool writes)> hook) = 0;
  // Called just before (begins) and just after each inner step's compute: an island ahead of its
  // period runs the step at idle CPU priority (outer/yield.h). Default: nothing.
  virtual void compute(bool begins) {}
};

// A pause before a step (loom train --stall STEP:SECONDS): an island that stalls, its heartbeat
// alive (tests stragglers). The pause is not counted in its steps' time, so not in its speed.
struct Stall {
  int64_t step = 0;  // 0: none
  double seconds = 0;
};
// "STEP:SECONDS" with 1 <= STEP and 0 < SECONDS <= 86400; a loom::Error naming `spec` otherwise.
Stall parse_stall(const std::string& spec);

struct RunOptions {
  std::string run_dir;  // "": runs/<config's stem>
  bool resume = false;  // continue from the newest complete checkpoint
  double slowdown = 1;  // make each step take this many times as long (tests stragglers)
  Stall stall;
  // A Chrome trace (runtime/trace.h) of the first trace_steps steps this process runs, every
  // rank's, written to trace_path ("": none) at the end of the run.
  std::string trace_path;
  int64_t trace_steps = 3;
  // Joins the outer service with the run's ParamStore (loaded or initialised): null when the config
  // has no [outer] server.
  std::function<std::unique_ptr<OuterSync>(ParamStore&, const std::string& run_dir)> join_outer;
};

// A run checked and opened before any rank starts: bad data, a vocabulary mismatch, a run directory
// that holds checkpoints without --resume, and combinations a plan cannot take throw loom::Error.
struct Run {
  std::string dir, checkpoints, metrics;
  std::optional<std::string> latest;  // the checkpoint to resume from
  data::TextCorpus corpus;
  // the run directory's lock, taken before anything there is looked at (a process of an mpirun
  // job takes none here: its rank 0 takes it in train_rank)
  std::shared_ptr<DirLock> lock;
};
Run open_run(const Config& cfg, const RunOptions& opts);

// Each step as it ends (the CLI's progress line).
struct StepReport {
  int64_t step = 0, max_steps = 0, start = 1;
  float loss = 0;
  double tokens_per_s = 0, elapsed_s = 0;
};

struct RunResult {
  int64_t start = 1, last_step = 0;  // the first step this process ran, and the last
  float loss = 0;
  double first_val = 0, last_val = 0;  // NaN when not evaluated
  bool already_trained = false;        // a resumed run past [train] steps: nothing ran
  std::string outer_summary;
};

// One rank's training loop; `comms` is null without a plan. `progress` (optional) sees every step
// on the writer. Throws loom::Error (a non-finite loss, a checkpoint that cannot be written, ...).
RunResult train_rank(const Config& cfg, Run& run, const RunOptions& opts,
                     const runtime::MeshComms* comms,
                     const std::function<void(const StepReport&)>& progress = {});

}  // namespace loom::train
