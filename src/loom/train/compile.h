// Compiling a training step: a config and a step kind become the global graph (and, under a plan,
// this rank's program) through the compile pipeline (passes/), plus the handles a runner binds and
// reads: loss, gradients, hyper-parameters, gradient norm and AdamW moments.
//
// With [train] grad_accum = k > 1 the same graph, under any plan, adds each micro-batch's gradients
// into their sums and applies the optimizer to their mean; a micro-batch before the last runs only
// the rank program's first micro_nodes() nodes (passes::Accumulation).
//
// Not here: memory (a runner binds buffers), running (step.h), a rank's parameter blocks
// (rank_blocks.h). Invariant: every handle is an id of `graph()`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/passes/pipeline.h"
#include "loom/train/config.h"

namespace loom::train {

// What to compile from a config: the model, the batch and sequence length of [train], the
// optimizer, and the plan when `ranks` > 0 (the number of ranks it must fit).
passes::Options step_options(const Config& cfg, passes::StepKind kind, int64_t ranks);

// Shards the training step of cfg's [plan] as every rank's StepRunner will (each pipeline stage's
// program), so a plan's errors (loom::Error naming the tactic, value and axis) come before any
// rank starts.
void check_plan(const Config& cfg);

struct CompiledStep {
  passes::StepKind kind = passes::StepKind::train;
  passes::Compilation c;  // the global graph; under a plan, the rank program too
  bool sharded = false;   // under a plan of several ranks; else c.rank is the one-rank program
  // (the empty plan lowered: the global graph, every value whole) after the scheduled stage's
  // passes. Either way c.rank is what runs, c.rank.local mapping global values into it.
  int64_t accum = 1;  // micro-batches per step ([train] grad_accum)

  const ir::Graph& graph() const { return c.model.graph; }
  int loss() const { return c.model.loss; }
  const autodiff::TrainStep& optimizer() const { return c.optimizer; }
  // Gradient accumulation (accum > 1): the gradient sums and the scalars keep and scale.
  const passes::Accumulation* accumulation() const {
    return c.accumulation ? &*c.accumulation : nullptr;
  }
  // The nodes of the rank program that run on a micro-batch before the step's last (all of them
  // without accumulation).
  size_t micro_nodes() const {
    return c.accumulation ? size_t(c.accumulation->micro_nodes) : c.rank.graph.nodes().size();
  }
};

// Throws loom::Error for a config or plan that cannot be compiled. `rank`: the world rank whose
// program it is (under a pipeline tactic the stages' programs differ; every other plan's ranks
// share one).
CompiledStep compile_step(const Config& cfg, passes::StepKind kind, bool with_plan, int64_t ranks,
                          int64_t rank = 0);
// Under a pipeline tactic: every stage's rank program (the rank at that pipe coordinate, every
// other coordinate 0), the global graph compiled and lowered once, and the scheduled stage's passes
// before pipeline_stages (which alone reads the stage) run once, then cut per stage (what loom
// plan simulates side by side, and check_plan checks); without one, the one program every rank
// runs. Only the programs are kept: a stage's copy of the global compilation (m micro-batches of
// the whole model) goes as soon as its program is cut.
std::vector<shard::Program> compile_stages(const Config& cfg, passes::StepKind kind, int64_t ranks);
// The same from `trained`, cfg's training graph (passes::Stage::train: the plan has no part in it),
// which plan search compiles once for many plans.
CompiledStep compile_step(const Config& cfg, const passes::Compilation& trained, int64_t ranks);

}  // namespace loom::train
