// expert: expert parallelism (GShard). Each rank of the axis holds E/n of every MoE layer's experts
// (the stacked expert weights split on dim 0, their gradients and moments alike) and its own
// sequences of the batch, as data parallelism would. Propagation then meets the two splits at the
// experts' grouped GEMMs: the tokens' slots (E,B,S,C), split by sequence, reach the weights' expert
// split through an all-to-all, and come back through another before combine
// (tests/ir_text/expert.ir).
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

TacticDef expert_tactic() {
  return {.name = "expert",
          .summary = "MoE experts split by expert, the batch by sequence",
          .selects = "roles.experts, roles.batch_inputs",
          .not_after = {"fsdp", "zero1", "zero2", "expert", "pipeline"},
          .apply = [](TacticContext& c, const Tactic&) {
            const ir::Roles& r = c.roles();
            if (r.experts.empty())
              throw Error(fmt::format("{}: this model has no experts", c.by()),
                          "expert splits the experts of Mixture-of-Experts layers: set [model] "
                          "moe = { experts = ... }");
            for (int v : r.batch_inputs)
              if (!c.current(v).uses(c.axis())) c.split(v, 0);  // unless `data` split it already
            for (int p : r.experts) c.split_with_state(p, 0);
          }};
}

}  // namespace loom::shard
