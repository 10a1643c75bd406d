// differentiate (stage train): reverse-mode gradients of the loss with respect to every parameter
// (autodiff/), for the step kinds that need them. The graph's outputs become what the step returns:
// loss, logits (StepKind::grads) and every gradient; a fused training step's outputs are set by
// add_optimizer instead.
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass differentiate_pass() {
  return {"differentiate", "gradients of the loss for every parameter (reverse mode)", Stage::train,
          [](Compilation& c, const Options& o) {
            if (o.kind != StepKind::grads && o.kind != StepKind::train) return;
            ir::Graph& g = c.model.graph;
            ops::Builder b(g);
            std::vector<int> origin;
            c.grads = autodiff::gradients(b, c.model.loss, g.inputs_of_kind(ir::ValueKind::param),
                                          &origin);
            if (c.pipelining) {  // where each backward node runs (pipeline_stages)
              c.pipelining->origin = std::move(origin);
              c.pipelining->backward_nodes = int64_t(g.nodes().size());
            }
            if (o.kind == StepKind::train) return;
            std::vector<int> outs = c.model.loss_outputs();
            if (o.kind == StepKind::grads) outs.push_back(c.model.logits);
            for (auto [p, d] : c.grads) outs.push_back(d);
            g.set_outputs(outs);
          }};
}

}  // namespace loom::passes
