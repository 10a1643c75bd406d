// dce (stage scheduled, after recompute): dead-code removal. A node is kept when a kept node or the
// program's outputs read one of its outputs, or when it acts beyond its outputs: an optimizer
// (updates its parameter and moments in place), a collective or a wait (every rank must make the
// same calls), or any op that declares an in-place output. The rest is removed, and `local`
// forgets the values it made. A program the passes before left whole is returned unchanged (no
// rewrite).
#include <vector>

#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

bool acts(const ir::Node& n) {
  return ops::has_trait(n.op, ops::Trait::optimizer) ||
         ops::has_trait(n.op, ops::Trait::collective) || ops::has_trait(n.op, ops::Trait::p2p) ||
         ops::has_trait(n.op, ops::Trait::completion) || !ops::op_def(n.op).inplace.empty();
}

void run_dce(Compilation& c, const Options&) {
  const ir::Graph& g = c.rank.graph;
  std::vector<bool> live(g.values().size(), false), kept(g.nodes().size(), false);
  for (int v : c.rank.outputs) live[size_t(v)] = true;
  bool dead = false;
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const ir::Node& n = g.nodes()[i];
    bool keep = acts(n);
    for (int v : n.outputs) keep = keep || live[size_t(v)];
    kept[i] = keep;
    dead = dead || !keep;
    if (keep)
      for (int v : n.inputs) live[size_t(v)] = true;
  }
  if (!dead) return;
  shard::Program old = c.rank;
  for (int& v : old.local)
    if (v >= 0 && g.value(v).kind == ir::ValueKind::node && !kept[size_t(g.value(v).producer)])
      v = -1;
  Rewriter rw(old);
  for (const ir::Node& n : g.nodes())
    if (kept[size_t(n.id)]) rw.copy(n);
  c.rank = rw.finish();
}

}  // namespace

Pass dce_pass() {
  return {"dce", "remove nodes nothing reads (dead-code removal)", Stage::scheduled, run_dce};
}

}  // namespace loom::passes
