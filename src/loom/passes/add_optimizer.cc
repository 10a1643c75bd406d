// add_optimizer (stage train): global-norm gradient clipping and AdamW over every parameter, in the
// same graph as the forward and backward (autodiff::add_optimizer). The step's outputs become the
// loss, the gradient norm and (MoE) the cross-entropy and router load. With gradient accumulation
// each gradient is first added into its sum over the step's micro-batches, and the optimizer reads
// their mean (pass.h's Accumulation; micro_batch.cc orders the program for it). Skipped unless the
// step trains (StepKind::train).
#include "loom/ops/builder.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {

namespace {

// The gradient sums of c's gradients (pass.h's Accumulation); returns param -> the mean gradient
// the optimizer reads.
std::map<int, int> add_accumulation(Compilation& c) {
  ir::Graph& g = c.model.graph;
  ops::Builder b(g);
  Accumulation a;
  a.keep = g.add_input("accum.keep", {DType::f32, {}}, ir::ValueKind::input);
  a.scale = g.add_input("accum.scale", {DType::f32, {}}, ir::ValueKind::input);
  std::map<int, int> means;
  for (auto [p, d] : c.grads) {
    const std::string name = "grad_sum." + g.value(p).name;
    const int sum = g.add_input(name, g.value(d).type, ir::ValueKind::state);
    const int added = b.add(sum, d, name + ".add");
    const int kept = b.emit1(ir::Op::mul_scalar, {added, a.keep}, {}, name + ".kept");
    b.emit1(ir::Op::assign, {sum, kept}, {}, name + ".assign");
    means[p] = b.emit1(ir::Op::mul_scalar, {added, a.scale}, {}, "grad_mean." + g.value(p).name);
    a.sums[p] = sum;
    a.means[p] = means[p];
  }
  c.accumulation = a;
  return means;
}

}  // namespace

Pass add_optimizer_pass() {
  return {"add_optimizer", "gradient clipping and AdamW, updating parameters and moments in place",
          Stage::train, [](Compilation& c, const Options& o) {
            if (o.kind != StepKind::train) return;
            ir::Graph& g = c.model.graph;
            const std::map<int, int> grads = o.accumulate ? add_accumulation(c) : c.grads;
            c.optimizer = autodiff::add_optimizer(g, grads, o.optim);
            c.optimizer.loss = c.model.loss;
            std::vector<int> outs = c.model.loss_outputs();
            outs.insert(outs.begin() + 1, c.optimizer.grad_norm);
            g.set_outputs(outs);
          }};
}

}  // namespace loom::passes
