// reduce_cast (stage scheduled, after gather_cast, before bucket): sums reduced in a narrower
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
// Under [passes] activation_reduce_dtype = "bf16" the same is done to each reduction of a partial
// product, a matmul's output or a sum holding one, that is not a gradient: tensor parallelism's
// reductions of activations and their gradients (Megatron's row-parallel outputs and
// column-parallel input gradients: all-reduces, or reduce-scatters under sequence parallelism;
// under megatron alone the partial residual stream each norm reads), which Megatron-LM makes in
// the model's dtype (bf16). The matmuls still accumulate in f32 and the sum is cast back to f32;
// what is rounded is each rank's partial sum.
//
// bucket then packs the bf16 reductions of gradients as it packs f32 ones. Other collectives
// (parameters' gathers, the loss's and the vocabulary-parallel softmax's statistics, the
// embedding's lookup) are kept in their dtype. Both settings "f32", the default, leave the program
// unchanged: exact sums.
#include <map>

#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

// Per value: a matmul's output, or a sum holding one (the input gradient of several matmuls
// reading one value; under megatron alone the residual stream, kept a partial sum across the
// blocks and reduced for each norm that reads it). One pass in program order: an add's operands
// come before it.
std::vector<bool> partial_products(const ir::Graph& g) {
  std::vector<bool> holds(g.values().size(), false);
  for (const ir::Node& n : g.nodes()) {
    const bool h =
        n.op == ir::Op::matmul ||
        (n.op == ir::Op::add && (holds[size_t(n.inputs[0])] || holds[size_t(n.inputs[1])]));
    for (int out : n.outputs) holds[size_t(out)] = h;
  }
  return holds;
}

void run_reduce_cast(Compilation& c, const Options& o) {
  const ScheduleOptions& so = o.schedule;
  if (so.reduce_dtype == DType::f32 && so.activation_reduce_dtype == DType::f32) return;
  const ir::Graph& g = c.rank.graph;
  const Uses uses = uses_of(g);
  const std::vector<bool> partial = partial_products(g);
  std::vector<DType> narrowed(g.nodes().size(), DType::f32);  // f32: kept
  bool any = false;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::reduce_scatter && n.op != ir::Op::all_reduce) continue;
    if (g.value(n.inputs[0]).type.dtype != DType::f32) continue;
    DType& to = narrowed[size_t(n.id)];
    if (reduced_gradient_owner(g, n, uses) >= 0)
      to = so.reduce_dtype;
    else if (partial[size_t(n.inputs[0])])
      to = so.activation_reduce_dtype;
    any |= to != DType::f32;
  }
  if (!any) return;
  Rewriter rw(c.rank);
  ops::Builder& b = rw.builder();
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
    if (narrowed[size_t(n.id)] == DType::f32) {
      rw.copy(n);
      continue;
    }
    const std::string dt(dtype_name(narrowed[size_t(n.id)]));
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
          "reduce gradients in [passes] reduce_dtype and tensor parallelism's partial products "
          "in activation_reduce_dtype (bf16: half the bytes), cast back to f32 after",
          Stage::scheduled, run_reduce_cast};
}

}  // namespace loom::passes
