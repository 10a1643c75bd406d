// Compiling a training step: a config and a step kind become the global graph (and, under a plan,
// this rank's program) through the compile pipeline (passes/), plus the handles a runner binds and
// reads: loss, gradients, hyper-parameters, gradient norm and AdamW moments.
//
// With [train] grad_accum = k > 1 the forward+backward graph stops at the gradients, a graph of its
// own (`accumulate`) adds each micro-batch's gradients into their sums, and the optimizer is a
// third (`optimizer`), fed the sums: the add_optimizer pass builds them (passes::Accumulation).
//
// Not here: memory (a runner binds buffers), running (step.h), a rank's parameter blocks
// (rank_blocks.h). Invariant: every handle is an id of `graph()` except those of the separate
// optimizer graph, which are ids of `optimizer_graph()`.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "loom/passes/pipeline.h"
#include "loom/train/config.h"

namespace loom::train {

// What to compile from a config: the model, the batch and sequence length of [train], the
// optimizer, and the plan when `ranks` > 0 (the number of ranks it must fit).
passes::Options step_options(const Config& cfg, passes::StepKind kind, int64_t ranks);

// Shards the training step of cfg's [plan] as every rank's StepRunner will, so a plan's errors
// (loom::Error naming the tactic, value and axis) come before any rank starts.
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
  // The graph holding the optimizer (the step's own, or the accumulation's optimizer graph) and its
  // handles.
  bool separate_optimizer() const { return c.accumulation.has_value(); }
  // Gradient accumulation's optimizer and accumulate graphs (separate_optimizer()).
  const passes::Accumulation& accumulation() const { return *c.accumulation; }
  const ir::Graph& optimizer_graph() const {
    return separate_optimizer() ? accumulation().optimizer : graph();
  }
  const autodiff::TrainStep& optimizer() const {
    return separate_optimizer() ? accumulation().opt : c.optimizer;
  }
};

// Throws loom::Error for a config or plan that cannot be compiled.
CompiledStep compile_step(const Config& cfg, passes::StepKind kind, bool with_plan, int64_t ranks);
// The same from `trained`, cfg's training graph (passes::Stage::train: the plan has no part in it),
// which plan search compiles once for many plans.
CompiledStep compile_step(const Config& cfg, const passes::Compilation& trained, int64_t ranks);

}  // namespace loom::train
