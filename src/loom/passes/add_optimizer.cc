// add_optimizer (stage train): global-norm gradient clipping and AdamW over every parameter, in the
// same graph as the forward and backward (autodiff::add_optimizer). The step's outputs become the
// loss, the gradient norm and (MoE) the cross-entropy and router load. With gradient accumulation
// the step graph keeps its gradients, and the optimizer and the accumulation of micro-batches'
// gradients are graphs of their own (pass.h's Accumulation). Skipped unless the step trains
// (StepKind::train).
#include "loom/ops/builder.h"
#include "loom/ops/verify.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {

namespace {

// The optimizer and accumulate graphs of c's gradients (pass.h).
Accumulation build_accumulation(const Compilation& c, const Options& o) {
  Accumulation a;
  const ir::Graph& g = c.model.graph;
  std::map<int, int> grads;  // optimizer-graph param -> its gradient input
  for (auto [p, d] : c.grads) {
    const ir::Value& pv = g.value(p);
    const int op = a.optimizer.add_input(pv.name, pv.type, ir::ValueKind::param);
    a.grad_input[p] = grads[op] =
        a.optimizer.add_input("grad." + pv.name, pv.type, ir::ValueKind::input);
  }
  a.opt = autodiff::add_optimizer(a.optimizer, grads, o.optim);
  a.optimizer.add_output(a.opt.grad_norm);
  ops::verify_or_throw(a.optimizer, "optimizer graph for " + o.source);

  ops::Builder b(a.accumulate);
  a.coef = a.accumulate.add_input("coef", {DType::f32, {}}, ir::ValueKind::input);
  for (auto [p, d] : c.grads) {
    const ir::Value& pv = g.value(p);
    const int sum = a.accumulate.add_input("sum." + pv.name, pv.type, ir::ValueKind::state);
    const int grad = a.accumulate.add_input("grad." + pv.name, pv.type, ir::ValueKind::input);
    const int added = b.add(sum, grad, "sum." + pv.name + ".add");
    const int mean = b.emit1(ir::Op::mul_scalar, {added, a.coef}, {}, "sum." + pv.name + ".new");
    b.emit1(ir::Op::assign, {sum, mean}, {}, "sum." + pv.name + ".assign");
    a.sum[p] = sum;
    a.grad[p] = grad;
  }
  ops::verify_or_throw(a.accumulate, "accumulate graph for " + o.source);
  return a;
}

}  // namespace

Pass add_optimizer_pass() {
  return {"add_optimizer", "gradient clipping and AdamW, updating parameters and moments in place",
          Stage::train, [](Compilation& c, const Options& o) {
            if (o.kind != StepKind::train) return;
            if (o.accumulate) {
              c.accumulation = build_accumulation(c, o);
              return;
            }
            ir::Graph& g = c.model.graph;
            c.optimizer = autodiff::add_optimizer(g, c.grads, o.optim);
            c.optimizer.loss = c.model.loss;
            std::vector<int> outs = c.model.loss_outputs();
            outs.insert(outs.begin() + 1, c.optimizer.grad_norm);
            g.set_outputs(outs);
          }};
}

}  // namespace loom::passes
