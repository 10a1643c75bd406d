// reduce_cast (stage scheduled, after gather_cast, before bucket): gradients reduced in a narrower
// dtype. Under [passes] reduce_dtype = "bf16", each reduction of a gradient (a reduce_scatter or
// all_reduce whose result an optimizer reads as a parameter's gradient, or adds into its gradient
// sum: rewrite.h's reduced_gradient_owner) is made on a bf16 copy and its result cast back to f32,
// as FSDP2's MixedPrecisionPolicy(reduce_dtype=bfloat16) does: half the bytes on every link and in
// the collective's buffers, at the price of the sum's precision (each rank's gradient rounded to
// bf16; the local backend adds in f32 and rounds once, MPI's bf16 sum rounds at each step).
//
//   %g.reduce_scatter = reduce_scatter(%g) {axis, dim, n}                      (f32)
// becomes
//   %g.reduce_scatter.bf16_in = cast(%g) {to = "bf16"}
//   %g.reduce_scatter.bf16 = reduce_scatter(%g.reduce_scatter.bf16_in) {...}    (bf16)
//   %g.reduce_scatter = cast(%g.reduce_scatter.bf16) {to = "f32"}      (before its first reader)
//
// bucket then packs the bf16 reductions as it packs f32 ones. Other collectives (parameters'
// gathers, activations' reductions under tensor parallelism, the loss) are kept in their dtype.
// reduce_dtype = "f32", the default, leaves the program unchanged: exact sums.
#include <map>

#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

void run_reduce_cast(Compilation& c, const Options& o) {
  const DType to = o.schedule.reduce_dtype;
  if (to == DType::f32) return;
  const ir::Graph& g = c.rank.graph;
  const Uses uses = uses_of(g);
  std::vector<bool> narrowed(g.nodes().size(), false);
  bool any = false;
  for (const ir::Node& n : g.nodes())
    if (g.value(n.inputs[0]).type.dtype == DType::f32 && reduced_gradient_owner(g, n, uses) >= 0)
      any = narrowed[size_t(n.id)] = true;
  if (!any) return;
  Rewriter rw(c.rank);
  ops::Builder& b = rw.builder();
  const std::string dt(dtype_name(to));
  // each narrowed reduction's result is cast back right before its first reader, not right after
  // it, so that prefetch's wait for it stays late (a cast at once would wait at once)
  std::map<int, int> pending;  // old output -> its narrow result, not cast back yet
  auto cast_back = [&](int old) {
    auto it = pending.find(old);
    if (it == pending.end()) return;
    rw.alias(old, b.emit1(ir::Op::cast, {it->second}, {{"to", "f32"}}, g.value(old).name));
    pending.erase(it);
  };
  for (const ir::Node& n : g.nodes()) {
    for (int v : n.inputs) cast_back(v);
    if (!narrowed[size_t(n.id)]) {
      rw.copy(n);
      continue;
    }
    const std::string& name = g.value(n.outputs[0]).name;
    const int in =
        b.emit1(ir::Op::cast, {rw.map(n.inputs[0])}, {{"to", dt}}, name + "." + dt + "_in");
    pending[n.outputs[0]] = b.emit1(n.op, {in}, n.attrs, name + "." + dt);
  }
  while (!pending.empty()) cast_back(pending.begin()->first);  // read by the outputs alone
  c.rank = rw.finish();
}

}  // namespace

Pass reduce_cast_pass() {
  return {"reduce_cast",
          "reduce gradients in [passes] reduce_dtype (bf16: half the bytes), cast back to f32 "
          "after",
          Stage::scheduled, run_reduce_cast};
}

}  // namespace loom::passes
