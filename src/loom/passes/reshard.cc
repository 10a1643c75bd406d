// reshard (stage scheduled, before bucket): [passes] reshard_after_forward.
//
// Lowering gathers a split parameter at each use (shard/lower.h): the forward's all-gather, and
// again the backward's, so the gathered copy dies after its forward use and comes back for the
// backward (FSDP's reshard_after_forward = true; SimpleFSDP expresses it the same way, as a
// recompute of the all-gather). With reshard_after_forward = false this pass keeps the first
// gather of each parameter and makes every later identical gather (same op, input and attributes:
// the parameter's block, gathered over the same axis and dim) read it instead, so each parameter
// crosses the network once per step and its whole copy stays alive from its forward use to its
// last backward use: less communication, more memory (the planned peak says how much).
//
// Example: %w.all_gather = all_gather(%w) in the forward and %w.all_gather.1 = all_gather(%w) in
// the backward become one all_gather; the backward's matmul reads %w.all_gather.
//
// Only gathers of graph inputs (parameters) merge: a gather of a computed value is the gather of
// that value alone. Nothing is reordered here; bucket and prefetch run after.

#include <map>
#include <tuple>

#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

void run_reshard(Compilation& c, const Options& o) {
  if (o.schedule.reshard_after_forward) return;
  const ir::Graph& g = c.rank.graph;
  using Key = std::tuple<int, ir::Attrs>;          // the gathered input, the gather's attributes
  std::map<Key, int> first;                        // -> the first gather's old output
  std::vector<int> merged(g.values().size(), -1);  // a later gather's output -> the first's
  bool any = false;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::all_gather || g.value(n.inputs[0]).kind == ir::ValueKind::node) continue;
    const Key k{n.inputs[0], n.attrs};
    auto [it, fresh] = first.emplace(k, n.outputs[0]);
    if (!fresh) merged[size_t(n.outputs[0])] = it->second, any = true;
  }
  if (!any) return;
  Rewriter rw(c.rank);
  for (const ir::Node& n : g.nodes()) {
    if (n.op == ir::Op::all_gather && merged[size_t(n.outputs[0])] >= 0)
      rw.alias(n.outputs[0], rw.map(merged[size_t(n.outputs[0])]));
    else
      rw.copy(n);
  }
  c.rank = rw.finish();
}

}  // namespace

Pass reshard_pass() {
  return {"reshard",
          "gather each parameter once per step and keep it to its last use "
          "([passes] reshard_after_forward = false)",
          Stage::scheduled, run_reshard};
}

}  // namespace loom::passes
