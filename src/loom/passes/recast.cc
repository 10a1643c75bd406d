// recast (stage train, after differentiate): a weight's cast is made again for the backward
// instead of kept from the forward. Under `dtype = "bf16"` the model casts each f32 master weight
// to bf16 right before its matmul (models/); the matmul's VJP reads that bf16 copy again in the
// backward. Kept, every weight's copy would live from its forward use across the loss to its
// backward use: the whole model once more in bf16 for the whole step. A cast costs one pass over
// the weight, so this pass makes each backward reader of a forward cast of a graph input read a
// fresh cast (`%<weight>.bwd.bf16`), made right before its first backward reader and shared by
// the later ones. Lowering then gathers a split weight for that cast as for any other use.
//
//   %w.bf16 = cast(%w) {to = "bf16"}                 (forward)
//   ...
//   %grad.x = matmul(%grad.y, %w.bf16)               (backward)
// becomes
//   %w.bwd.bf16 = cast(%w) {to = "bf16"}
//   %grad.x = matmul(%grad.y, %w.bwd.bf16)
//
// The cast is the same op on the same input, so every bit of every gradient is unchanged. The
// backward is every node after the one that computes the loss. Casts of computed values (an
// activation) are recompute's business (stage scheduled, [passes] recompute). [passes] recast =
// false keeps the forward's casts instead: a pass over the weights less a step for the bf16 copy
// of the whole model held from the forward to the backward (what PyTorch's autocast cache does).
#include <map>
#include <numeric>

#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

void run_recast(Compilation& c, const Options& o) {
  if (c.grads.empty() || !o.schedule.recast) return;  // no backward, or [passes] recast = false
  const ir::Graph& g = c.model.graph;
  const int boundary = g.value(c.model.loss).producer;
  // a forward cast of a graph input that a backward node reads
  auto recastable = [&](int v) {
    const ir::Value& val = g.value(v);
    if (val.kind != ir::ValueKind::node || val.producer > boundary) return false;
    const ir::Node& p = g.node(val.producer);
    return p.op == ir::Op::cast && g.value(p.inputs[0]).kind != ir::ValueKind::node;
  };
  bool any = false;
  for (const ir::Node& n : g.nodes())
    if (n.id > boundary)
      for (int in : n.inputs) any = any || recastable(in);
  if (!any) return;

  shard::Program old;
  old.graph = g;
  old.local.resize(g.values().size());
  std::iota(old.local.begin(), old.local.end(), 0);
  old.outputs = g.outputs();
  Rewriter rw(old);
  std::map<int, int> recast;  // forward cast -> its backward copy (new id)
  for (const ir::Node& n : old.graph.nodes()) {
    if (n.id <= boundary) {
      rw.copy(n);
      continue;
    }
    std::vector<int> ins;
    for (int in : n.inputs) {
      if (!recastable(in)) {
        ins.push_back(rw.map(in));
        continue;
      }
      auto it = recast.find(in);
      if (it == recast.end()) {
        const ir::Node& p = g.node(g.value(in).producer);
        const std::string name =
            g.value(p.inputs[0]).name + ".bwd." + std::string(dtype_name(g.value(in).type.dtype));
        it =
            recast
                .emplace(in, rw.builder().emit1(ir::Op::cast, {rw.map(p.inputs[0])}, p.attrs, name))
                .first;
      }
      ins.push_back(it->second);
    }
    const std::vector<int> outs = rw.copy_with(n, ins);
    for (size_t i = 0; i < outs.size(); ++i) rw.alias(n.outputs[i], outs[i]);
  }
  shard::Program next = rw.finish();
  // every handle into the graph, through the old -> new map
  auto map = [&](int v) { return v < 0 ? v : next.local[size_t(v)]; };
  models::ModelGraph& m = c.model;
  for (int* h : {&m.tokens, &m.targets, &m.logits, &m.loss, &m.ce_loss, &m.moe_kept, &m.moe_routed,
                 &m.start})
    *h = map(*h);
  for (int& v : m.caches) v = map(v);
  for (int& v : m.roles.batch_inputs) v = map(v);
  for (auto* ws : {&m.roles.column_parallel, &m.roles.row_parallel, &m.roles.vocab_parallel})
    for (ir::ParallelWeight& w : *ws) w.value = map(w.value);
  for (ir::ParamGroup& grp : m.roles.blocks)
    for (int& v : grp.params) v = map(v);
  for (int& v : m.roles.experts) v = map(v);
  std::map<int, int> grads;
  for (auto [p, d] : c.grads) grads[map(p)] = map(d);
  c.grads = std::move(grads);
  if (c.pipelining) {  // its values and nodes, through the same maps
    Pipelining& pl = *c.pipelining;
    for (auto& in : pl.inputs)
      for (int& v : in) v = map(v);
    std::map<int, int64_t> chunks;
    for (auto [p, s] : pl.param_chunk) chunks[map(p)] = s;
    pl.param_chunk = std::move(chunks);
    // a copied node's new id is its first output's producer; the fresh casts have no origin
    std::vector<int> origin(next.graph.nodes().size(), -1);
    auto node = [&](int n) { return next.graph.value(map(g.node(n).outputs[0])).producer; };
    for (const ir::Node& n : g.nodes())
      if (size_t(n.id) < pl.origin.size() && pl.origin[size_t(n.id)] >= 0)
        origin[size_t(node(n.id))] = node(pl.origin[size_t(n.id)]);
    pl.origin = std::move(origin);
    pl.backward_nodes = int64_t(next.graph.nodes().size());  // the casts join the backward
  }
  m.graph = std::move(next.graph);
}

}  // namespace

Pass recast_pass() {
  return {"recast",
          "a weight's cast made again for the backward instead of kept from the forward (bf16)",
          Stage::train, run_recast};
}

}  // namespace loom::passes
