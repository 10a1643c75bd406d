// apply_tactics (stage sharded): the plan's tactics, in order, set the shardings of the values the
// model's roles name (shard/plan.h). Checks first that the mesh has as many ranks as the run. Under
// gradient accumulation each gradient sum is kept as the tactics keep the mean gradient it feeds
// (pass.h's Accumulation), so an fsdp or zero2 rank holds its block of each sum, and is a partial
// sum over the batch axes that do not split it (keep_sums below).
#include <fmt/format.h>

#include <algorithm>

#include "loom/core/error.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {

namespace {

// Gradient accumulation's sums (pass.h's Accumulation): each kept as the tactics keep the mean
// gradient it feeds (an fsdp or zero2 rank: its block), and left unreduced, a partial sum, over
// the axes that split the batch but not the mean (data parallelism's: DDP's no_sync), so those
// gradients are reduced once a step, on its last micro-batch, rather than on every one.
void keep_sums(Compilation& c, const shard::Plan& plan) {
  const shard::Mesh& mesh = plan.mesh;
  std::vector<std::string> batch_axes;  // the axes the batch's rows are split over
  for (int v : c.model.roles.batch_inputs)
    if (auto it = c.annotations.find(v);
        it != c.annotations.end() && !it->second.sharding.dims.empty())
      for (const std::string& a : it->second.sharding.dims[0])
        if (std::find(batch_axes.begin(), batch_axes.end(), a) == batch_axes.end())
          batch_axes.push_back(a);
  for (auto [p, sum] : c.accumulation->sums) {
    const ir::Value& v = c.model.graph.value(sum);
    auto it = c.annotations.find(c.accumulation->means.at(p));
    shard::Annotation a;
    if (it != c.annotations.end()) {
      a = it->second;
      a.has_use = false;
    } else {
      a.sharding = shard::Sharding::replicated(v.type.shape.size());
      a.priority = int(plan.tactics.size());  // after every tactic's
      a.by = "gradient accumulation";
    }
    for (const auto& [axis, size] : mesh.axes())  // mesh order, as Sharding::partial is kept
      if (std::find(batch_axes.begin(), batch_axes.end(), axis) != batch_axes.end() &&
          !a.sharding.uses(axis))
        a.sharding.partial.push_back(axis);
    if (it != c.annotations.end() || !a.sharding.partial.empty()) c.annotations[sum] = a;
  }
}

}  // namespace

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
            if (c.accumulation) keep_sums(c, plan);
          }};
}

}  // namespace loom::passes
