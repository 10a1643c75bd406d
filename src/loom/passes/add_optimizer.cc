// add_optimizer (stage train): global-norm gradient clipping and AdamW over every parameter, in the
// same graph as the forward and backward (autodiff::add_optimizer). The step's outputs become the
// loss, the gradient norm and (MoE) the cross-entropy and router load. Skipped unless the step
// trains in one graph (StepKind::train without gradient accumulation).
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass add_optimizer_pass() {
  return {"add_optimizer", "gradient clipping and AdamW, updating parameters and moments in place",
          Stage::train, [](Compilation& c, const Options& o) {
            if (o.kind != StepKind::train || o.accumulate) return;
            ir::Graph& g = c.model.graph;
            c.optimizer = autodiff::add_optimizer(g, c.grads, o.optim);
            c.optimizer.loss = c.model.loss;
            std::vector<int> outs = c.model.loss_outputs();
            outs.insert(outs.begin() + 1, c.optimizer.grad_norm);
            g.set_outputs(outs);
          }};
}

}  // namespace loom::passes
