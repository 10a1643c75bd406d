// Compiling a training step: a config and a step kind become the global graph (and, under a plan,
// this rank's program) through the compile pipeline (passes/), plus the handles a runner binds and
// reads: loss, gradients, hyper-parameters, gradient norm and AdamW moments.
//
// With [train] grad_accum = k > 1 the forward+backward graph stops at the gradients, a graph of its
// own (`accumulate`) adds each micro-batch's gradients into their sums, and the optimizer is a
// third (`optimizer`), fed the sums:
//
//   graph accumulate {                     per parameter P; run after micro-batches 1 .. k-1
//     state %sum.P : f32[...]              (micro-batch 0's gradients are copied in)
//     input %grad.P : f32[...]             the step graph's gradient of P
//     input %coef : f32[]                  1, and 1/k after the last micro-batch (their mean)
//     %sum.P.add = add(%sum.P, %grad.P)
//     %sum.P.new = mul_scalar(%sum.P.add, %coef)
//     %sum.P.assign = assign(%sum.P, %sum.P.new)
//   }
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
  // Gradient accumulation: the optimizer graph, its handles, and its gradient input per param.
  ir::Graph opt_graph{"optimizer"};
  autodiff::TrainStep opt;
  std::map<int, int> opt_grad_input;  // global param id -> optimizer-graph gradient input
  // ... and the accumulate graph: per param its sum (state) and micro-batch gradient (input).
  ir::Graph accum_graph{"accumulate"};
  std::map<int, int> accum_sum, accum_grad;  // global param id -> accumulate-graph value
  int accum_coef = -1;                       // its scalar input

  const ir::Graph& graph() const { return c.model.graph; }
  int loss() const { return c.model.loss; }
  // The graph holding the optimizer (the step's own, or opt_graph when accumulating) and its
  // handles.
  bool separate_optimizer() const { return accum > 1; }
  const ir::Graph& optimizer_graph() const { return separate_optimizer() ? opt_graph : graph(); }
  const autodiff::TrainStep& optimizer() const { return separate_optimizer() ? opt : c.optimizer; }
};

// Throws loom::Error for a config or plan that cannot be compiled.
CompiledStep compile_step(const Config& cfg, passes::StepKind kind, bool with_plan, int64_t ranks);

}  // namespace loom::train
