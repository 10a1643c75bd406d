// build_model (stage forward): the model's forward graph from [model] (models/), with the outputs
// the forward stage promises: the loss, and the logits for a step that samples (StepKind::infer).
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass build_model_pass() {
  return {"build_model", "the model's forward graph and loss, from [model]", Stage::forward,
          [](Compilation& c, const Options& o) {
            c.model = models::build_model(o.model, o.batch, o.seq_len);
            c.model.graph.add_output(c.model.loss);
            if (o.kind == StepKind::infer) c.model.graph.add_output(c.model.logits);
          }};
}

}  // namespace loom::passes
