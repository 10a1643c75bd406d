// build_model (stage forward): the model's forward graph from [model] (models/), with the outputs
// the forward stage promises: the loss, and the logits for a step that samples (StepKind::infer);
// an MoE model's cross-entropy and router load (models/model.h) besides; for a decode step
// (StepKind::decode) the decode graph and its logits (no loss).
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass build_model_pass() {
  return {"build_model", "the model's forward graph and loss, from [model]", Stage::forward,
          [](Compilation& c, const Options& o) {
            if (o.kind == StepKind::decode) {
              if (!o.plan.empty())
                throw Error(fmt::format("{}: a decode step runs on one process, without a [plan]",
                                        o.source));
              c.model = models::build_decode(o.model, o.batch, o.seq_len, o.cache_len);
              c.model.graph.add_output(c.model.logits);
              return;
            }
            c.model = models::build_model(o.model, micro_batch_rows(o), o.seq_len);
            for (int v : c.model.loss_outputs()) c.model.graph.add_output(v);
            if (o.kind == StepKind::infer) c.model.graph.add_output(c.model.logits);
          }};
}

}  // namespace loom::passes
