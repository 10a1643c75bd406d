// data: data parallelism. Splits the batch inputs the model declares (tokens, targets) on dim 0;
// propagation carries the split through the forward and backward, and the gradients' partial sums
// become all-reduces (or reduce-scatters under fsdp/zero2) when lowered.
#include "loom/shard/tactic.h"

namespace loom::shard {

TacticDef data_tactic() {
  return {.name = "data",
          .summary = "split the batch on dim 0",
          .selects = "roles.batch_inputs",
          .not_after = {"data", "expert", "pipeline"},
          .apply = [](TacticContext& c, const Tactic&) {
            for (int v : c.roles().batch_inputs) c.split(v, 0);
          }};
}

}  // namespace loom::shard
