// recompute (stage scheduled, after reshard): [passes] recompute, activation checkpointing.
//
// A training step keeps what its backward reads from the forward alive across the loss: the saved
// activations (runtime::saved_activation_bytes counts them). This pass makes some of them again in
// the backward instead: each backward read of such a value reads a copy made right before its
// first backward reader, from kept values (recursively, where an input is itself made again); the
// forward's copy then dies at its last forward use.
//
//   selective  keeps the outputs of matmuls and attention (costly to make again) and recomputes
//              the cheap ones: norms (rmsnorm, layernorm: outputs and statistics), activations
//              (swiglu, gelu), rope and casts.
//   selective_op  torchtitan's per-op policy (selective_ac_option = "op", which its published
//              Llama 3.1 runs use): inside a layer as full, except that attention's outputs,
//              every odd matmul's (the 1st, 3rd, ... of the layer in forward order) and the
//              reduce-scatters' and all-reduces' are kept (torchtitan's save list), so a Llama
//              block keeps the q, v, gate and down projections' outputs and makes the k, o and
//              up projections again, with everything between, sequence parallelism's
//              all-gathers included; outside the layers as selective.
//   full       keeps only each layer's inputs (roles.blocks' layers: the residual stream entering
//              a transformer block, and any other value made outside it that it reads) and makes
//              the rest of the layer again, matmuls, attention and the layer's collectives
//              included (Megatron-LM's full recompute communicates again: a kept all-gather of
//              sequence parallelism's would hold the whole sequence, t times its shard), when its
//              backward starts; outside the layers (the embedding, the head) as selective. A
//              parameter's all-gather is made again only under reshard_after_forward = true,
//              which the backward makes again anyway: the recompute gathers it, and the
//              backward's own all-gather, the same node on the same input, becomes a read of that
//              one (a backward node equal to a recomputed one is never computed twice).
//
// A forward value belongs to the last parameter group (in forward order) that it depends on: a
// parameter to its group, a node's output to the latest group among its inputs, a value made from
// inputs alone (positions, rope tables) to none. A value is a layer's input when a forward node of
// another group reads it.
//
// Example (a Llama block, selective): %attn_norm, %attn_rstd = rmsnorm(%h, %w) is read by the
// q/k/v weight gradients' matmuls and by rmsnorm_bwd; those now read %attn_norm.recompute, made
// from %h and %w (both kept: %h is the residual stream, %w a parameter) just before the first of
// them. Under full, the first backward read in layer l (the down projection's input) makes the
// layer's forward again, from %h and the parameters, up to that value; the later reads find their
// copies made.
//
// The recomputed node is the same op on the same inputs, so in f32 every loss bit is unchanged
// (tests/plan_parity.h runs the plans with it). The forward/backward boundary is the node that
// computes the loss (the program's loss output, followed back through its collectives). A planned
// run's rank program is rewritten; so is one process's, the one-rank program lowering makes of the
// empty plan.
//
// Under a pipeline the pass runs before pipeline_stages, on every stage's program for every
// micro-batch (the micro-batches' forwards all come before the loss, their mean). A node made
// again counts as made by its first backward reader's global node (Program::origin), so
// pipeline_stages runs it in that reader's item: the backward of the same micro-batch and chunk,
// on the reader's stage.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

// The node that computes the loss in the rank program, or -1.
int loss_node(const Compilation& c) {
  const auto& outs = c.model.graph.outputs();
  for (size_t i = 0; i < outs.size() && i < c.rank.outputs.size(); ++i) {
    if (outs[i] != c.model.loss) continue;
    const ir::Value& v =
        c.rank.graph.value(ops::before_collectives(c.rank.graph, c.rank.outputs[i]));
    return v.kind == ir::ValueKind::node ? v.producer : -1;
  }
  return -1;
}

// Each rank-program value's parameter group (an index into roles.blocks), or -1; for the values
// of the forward (params, inputs, and nodes before `boundary`).
std::vector<int> forward_groups(const Compilation& c, int boundary) {
  const ir::Graph& g = c.rank.graph;
  std::vector<int> group = param_groups(c);
  for (const ir::Node& n : g.nodes()) {
    if (n.id >= boundary) break;
    int k = -1;
    for (int v : n.inputs) k = std::max(k, group[size_t(v)]);
    for (int v : n.outputs) group[size_t(v)] = k;
  }
  return group;
}

void run_recompute(Compilation& c, const Options& o) {
  using R = ScheduleOptions::Recompute;
  if (o.schedule.recompute == R::none) return;
  const int boundary = loss_node(c);
  if (boundary < 0) return;
  static const std::set<ir::Op> cheap{ir::Op::rmsnorm, ir::Op::layernorm, ir::Op::swiglu,
                                      ir::Op::gelu,    ir::Op::rope,      ir::Op::cast};
  const ir::Graph& g = c.rank.graph;
  const auto& blocks = c.model.roles.blocks;
  const bool full = o.schedule.recompute == R::full;
  const bool alternate = o.schedule.recompute == R::selective_op;
  const bool whole_layers = full || alternate;  // layers made again beyond their cheap ops
  std::vector<int> group;
  std::vector<bool> layer_input(g.values().size(), false);
  std::vector<bool> again_matmul(g.values().size(), false);  // selective_op's every second one
  if (whole_layers) {
    group = forward_groups(c, boundary);
    std::map<int, int> matmuls;  // per layer group, in forward order
    for (const ir::Node& n : g.nodes()) {
      if (n.id >= boundary) break;
      const int k = group[size_t(n.outputs[0])];
      for (int v : n.inputs)
        if (group[size_t(v)] != k) layer_input[size_t(v)] = true;
      if (alternate && n.op == ir::Op::matmul && k >= 0 && blocks[size_t(k)].layer() &&
          ++matmuls[k] % 2 == 0)
        again_matmul[size_t(n.outputs[0])] = true;
    }
  }
  auto in_layer = [&](int v) {
    const int k = group.empty() ? -1 : group[size_t(v)];
    return k >= 0 && blocks[size_t(k)].layer();
  };
  auto again_able = [&](int v) {
    const ir::Value& val = g.value(v);
    if (val.kind != ir::ValueKind::node || val.producer >= boundary) return false;
    const ir::Op op = g.node(val.producer).op;
    if (!whole_layers || !in_layer(v)) return cheap.count(op) > 0;
    if (layer_input[size_t(v)]) return false;
    if (ops::has_trait(op, ops::Trait::collective) || ops::has_trait(op, ops::Trait::completion)) {
      // a parameter's all-gather, which the backward makes again anyway under
      // reshard_after_forward
      if (g.value(ops::before_collectives(g, v)).kind == ir::ValueKind::param)
        return o.schedule.reshard_after_forward;
      return full || op == ir::Op::all_gather;  // selective_op: torchtitan saves the reductions
    }
    if (alternate && (op == ir::Op::attention || op == ir::Op::matmul))
      return bool(again_matmul[size_t(v)]);
    return true;
  };
  std::vector<bool> reads_again(g.nodes().size(), false);  // backward nodes that read a copy
  for (const ir::Node& n : g.nodes())
    if (n.id > boundary)
      for (int v : n.inputs) reads_again[size_t(n.id)] = reads_again[size_t(n.id)] || again_able(v);
  if (std::find(reads_again.begin(), reads_again.end(), true) == reads_again.end()) return;

  Rewriter rw(c.rank);
  std::map<int, int> again;  // old forward value -> its recomputed new value
  // The recomputed nodes by (op, new inputs): a backward node that computes the same (the
  // backward's own all-gather of a parameter a full recompute gathered again) reads theirs, the
  // latest made (under a pipeline each micro-batch's backward makes its own gathers again, and
  // reading an earlier micro-batch's would keep that copy alive between the two).
  std::map<std::pair<ir::Op, std::vector<int>>, std::vector<const ir::Node*>> made;
  auto same_as_made = [&](const ir::Node& n, const std::vector<int>& ins) -> const ir::Node* {
    auto it = made.find({n.op, ins});
    if (it == made.end()) return nullptr;
    for (auto m = it->second.rbegin(); m != it->second.rend(); ++m)
      if ((*m)->attrs == n.attrs && (*m)->outputs.size() == n.outputs.size()) return *m;
    return nullptr;
  };
  // The new value a backward node reads for old value v: v's recomputed copy where it can be made
  // again, else v itself. `reader`: the backward node (old id) it is made for.
  int reader = -1;
  std::function<int(int)> backward_read = [&](int v) -> int {
    if (!again_able(v)) return rw.map(v);
    if (auto it = again.find(v); it != again.end()) return it->second;
    const ir::Node& p = g.node(g.value(v).producer);
    std::vector<int> ins;
    for (int u : p.inputs) ins.push_back(backward_read(u));
    const std::vector<int> outs = rw.copy_with(p, ins, ".recompute");
    rw.set_origin(rw.graph().value(outs[0]).producer, rw.origin_of(reader));
    for (size_t i = 0; i < outs.size(); ++i) again[p.outputs[i]] = outs[i];
    made[{p.op, ins}].push_back(&p);
    return again.at(v);
  };
  for (const ir::Node& n : g.nodes()) {
    std::vector<int> ins;
    reader = n.id;
    for (int v : n.inputs) ins.push_back(reads_again[size_t(n.id)] ? backward_read(v) : rw.map(v));
    if (const ir::Node* m = n.id > boundary ? same_as_made(n, ins) : nullptr) {
      for (size_t i = 0; i < n.outputs.size(); ++i) rw.alias(n.outputs[i], again.at(m->outputs[i]));
      continue;
    }
    const std::vector<int> outs = rw.copy_with(n, ins);
    for (size_t i = 0; i < outs.size(); ++i) rw.alias(n.outputs[i], outs[i]);
  }
  c.rank = rw.finish();
}

}  // namespace

Pass recompute_pass() {
  return {
      "recompute",
      "make activations again in the backward instead of keeping them across the loss ([passes] "
      "recompute: selective, selective_op, full)",
      Stage::scheduled, run_recompute};
}

}  // namespace loom::passes
