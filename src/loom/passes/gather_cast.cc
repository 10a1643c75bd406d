// gather_cast (stage scheduled, after dce, before bucket): gather parameters in the dtype they are
// computed in. Under `dtype = "bf16"` the model casts each f32 master weight to bf16 right before
// its matmul (models/), so the lowered program gathers the f32 block and casts the whole gathered
// copy: twice the bytes on the network and in the gathered buffer. Where every reader of an
// all-gather's output (a parameter's, or an activation's under sequence parallelism) is a cast to
// one narrower dtype, this pass casts the rank's block first and gathers the cast block instead
// (FSDP2's MixedPrecisionPolicy(param_dtype) does the same for parameters); each cast's output now
// reads the gathered value.
//
//   %w.all_gather = all_gather(%w) {axis, dim, n}          (f32, n x the block)
//   %w.bf16 = cast(%w.all_gather) {to = "bf16"}
// becomes
//   %w.all_gather.cast = cast(%w) {to = "bf16"}             (the block, in bf16)
//   %w.bf16 = all_gather(%w.all_gather.cast) {axis, dim, n}
//
// A cast is elementwise, so casting the blocks and gathering them is bit for bit the gathered
// cast: no loss bit changes (tests/plan_parity_test.cc: GatherCast.*). Gathers whose
// copy is read by anything but such casts (a norm's f32 weight, the f32 weight a gradient op
// reads) are kept as they are. [passes] cast_before_gather = false turns the pass off.
#include <map>
#include <vector>

#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

void run_gather_cast(Compilation& c, const Options& o) {
  if (!o.schedule.cast_before_gather) return;
  const ir::Graph& g = c.rank.graph;
  std::vector<std::vector<int>> readers(g.values().size());  // value -> reading nodes
  for (const ir::Node& n : g.nodes())
    for (int v : n.inputs) readers[size_t(v)].push_back(n.id);
  std::map<int, std::vector<int>> casts;  // all_gather node -> the casts of its output
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::all_gather) continue;
    const auto& rs = readers[size_t(n.outputs[0])];
    if (rs.empty()) continue;
    const std::string to = g.node(rs[0]).op == ir::Op::cast ? g.node(rs[0]).attr_str("to") : "";
    bool all = !to.empty() && g.value(n.inputs[0]).type.dtype == DType::f32 && to != "f32";
    for (int r : rs) all = all && g.node(r).op == ir::Op::cast && g.node(r).attr_str("to") == to;
    if (all) casts[n.id] = rs;
  }
  if (casts.empty()) return;
  std::vector<bool> folded(g.nodes().size(), false);  // casts now done before their gather
  for (const auto& [gather, cs] : casts)
    for (int x : cs) folded[size_t(x)] = true;
  Rewriter rw(c.rank);
  ops::Builder& b = rw.builder();
  for (const ir::Node& n : g.nodes()) {
    if (folded[size_t(n.id)]) continue;
    auto it = casts.find(n.id);
    if (it == casts.end()) {
      rw.copy(n);
      continue;
    }
    const ir::Node& first = g.node(it->second[0]);
    const std::string& name = g.value(n.outputs[0]).name;
    const int block = b.emit1(ir::Op::cast, {rw.map(n.inputs[0])}, {{"to", first.attr_str("to")}},
                              name + ".cast");
    const int gathered =
        b.emit1(ir::Op::all_gather, {block}, n.attrs, g.value(first.outputs[0]).name);
    for (int x : it->second) rw.alias(g.node(x).outputs[0], gathered);
  }
  c.rank = rw.finish();
}

}  // namespace

Pass gather_cast_pass() {
  return {"gather_cast",
          "gather a parameter in the dtype its readers cast it to (bf16 weights on the wire; "
          "[passes] cast_before_gather)",
          Stage::scheduled, run_gather_cast};
}

}  // namespace loom::passes
