// reshard (stage scheduled, before recompute and bucket): [passes] reshard_after_forward.
//
// Lowering gathers a split parameter once, before its first reader, and every later reader reads
// that copy (shard/lower.h): each parameter crosses the network once per step, and its whole copy
// lives from its forward use to its last backward use. With reshard_after_forward = true (the
// default; FSDP's reshard_after_forward, which SimpleFSDP expresses the same way: as a recompute
// of the all-gather) this pass gives each later reader a gather of its own, made right before it,
// so every gathered copy dies after the op that reads it: the backward gathers again, and no
// whole parameter outlives its reader. More communication, less memory (the planned peak says
// how much).
//
// Example: %w.all_gather = all_gather(%w) read by the forward's matmul and the backward's
// becomes a second %w.all_gather.1 = all_gather(%w) right before the backward's matmul, which
// reads it.
//
// What is gathered again: a parameter the plan stores split but lets its readers see otherwise
// (an annotation with a `use`: fsdp, zero3), and only the chain of gathers that lowering made of
// it (all_gather, all_to_all, shard_slice from the parameter), not anything computed from it.
// Each reader's operand gets its own chain; the in-place update (adamw) reads the parameter's
// own block and is not a reader of the copy. Nothing else is reordered; bucket and prefetch run
// after.

#include <fmt/format.h>

#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

bool gathers(ir::Op op) {
  return op == ir::Op::all_gather || op == ir::Op::all_to_all || op == ir::Op::shard_slice;
}

void run_reshard(Compilation& c, const Options& o) {
  if (!o.schedule.reshard_after_forward) return;
  const ir::Graph& g = c.rank.graph;
  // root[u]: the split parameter value u is a gathered copy of (through gathers alone), or -1
  std::vector<int> root(g.values().size(), -1);
  bool any = false;
  for (const auto& [v, a] : c.annotations) {
    const int local = c.rank.local[size_t(v)];
    if (a.has_use && local >= 0 && g.value(local).kind != ir::ValueKind::node)
      root[size_t(local)] = local;
  }
  std::vector<bool> copy_node(g.nodes().size(), false);  // a node of a gather chain
  for (const ir::Node& n : g.nodes()) {
    if (!gathers(n.op) || n.inputs.size() != 1 || root[size_t(n.inputs[0])] < 0) continue;
    root[size_t(n.outputs[0])] = root[size_t(n.inputs[0])];
    copy_node[size_t(n.id)] = any = true;
  }
  if (!any) return;

  Rewriter rw(c.rank);
  std::vector<bool> read(g.values().size(), false);  // a copy its first reader has read
  // a new chain of gathers from u's parameter to u, as lowering names them
  auto gather_again = [&](int u) {
    std::vector<const ir::Node*> chain;
    for (int x = u; g.value(x).kind == ir::ValueKind::node; x = chain.back()->inputs[0])
      chain.push_back(&g.node(g.value(x).producer));
    int cur = rw.map(root[size_t(u)]);
    const std::string& base = g.value(root[size_t(u)]).name;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it)
      cur = rw.graph().add_node((*it)->op, {cur}, (*it)->attrs, {g.value((*it)->outputs[0]).type},
                                {fmt::format("{}.{}", base, (*it)->op)})[0];
    return cur;
  };
  for (const ir::Node& n : g.nodes()) {
    if (copy_node[size_t(n.id)]) {
      rw.copy(n);
      continue;
    }
    std::vector<int> ins;
    for (int u : n.inputs) {
      const bool copy = root[size_t(u)] >= 0 && g.value(u).kind == ir::ValueKind::node;
      if (copy && read[size_t(u)])
        ins.push_back(gather_again(u));
      else
        ins.push_back(rw.map(u));
      if (copy) read[size_t(u)] = true;
    }
    const std::vector<int> outs = rw.copy_with(n, ins);
    for (size_t i = 0; i < outs.size(); ++i) rw.alias(n.outputs[i], outs[i]);
  }
  c.rank = rw.finish();
}

}  // namespace

Pass reshard_pass() {
  return {"reshard",
          "gather a split parameter again for each reader, so no gathered copy outlives it "
          "([passes] reshard_after_forward = true)",
          Stage::scheduled, run_reshard};
}

}  // namespace loom::passes
