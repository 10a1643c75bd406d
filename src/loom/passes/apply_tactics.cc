// apply_tactics (stage sharded): the plan's tactics, in order, set the shardings of the values the
// model's roles name (shard/plan.h). Checks first that the mesh has as many ranks as the run. Under
// gradient accumulation each gradient sum is kept as the tactics keep the mean gradient it feeds
// (pass.h's Accumulation), so an fsdp or zero2 rank holds its block of each sum.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass apply_tactics_pass() {
  return {"apply_tactics", "the plan's tactics annotate parameters, batch, gradients and moments",
          Stage::sharded, [](Compilation& c, const Options& o) {
            const shard::Plan& plan = o.plan;
            if (plan.mesh.size() != o.ranks)
              throw Error(fmt::format("{}: the mesh {} has {} ranks, but this run has {}",
                                      plan.where, plan.mesh.to_string(), plan.mesh.size(), o.ranks),
                          "make the product of the mesh's axis sizes equal the number of ranks "
                          "(mpirun -np N)");
            c.annotations = shard::apply_tactics(c.model.graph, plan, c.model.roles);
            if (!c.accumulation) return;
            for (auto [p, sum] : c.accumulation->sums) {
              auto it = c.annotations.find(c.accumulation->means.at(p));
              if (it == c.annotations.end()) continue;
              shard::Annotation a = it->second;
              a.has_use = false;
              c.annotations[sum] = a;
            }
          }};
}

}  // namespace loom::passes
