// recompute (stage scheduled, after reshard): [passes] recompute, activation checkpointing.
//
// A training step keeps what its backward reads from the forward alive across the loss: the saved
// activations (runtime::saved_activation_bytes counts them). With recompute = "selective" this
// pass keeps the outputs of matmuls and attention (costly to make again) and recomputes the cheap
// ones in the backward: norms (rmsnorm, layernorm: their outputs and statistics), activations
// (swiglu, gelu), rope and casts. Each backward read of such a value reads a copy made again right
// before its first backward reader, from the kept inputs (recursively, where an input is itself
// recomputed: a cast of a norm's output); the forward's copy then dies at its last forward use.
//
// Example (a Llama block): %attn_norm, %attn_rstd = rmsnorm(%h, %w) is read by the q/k/v weight
// gradients' matmuls and by rmsnorm_bwd; those now read %attn_norm.recompute, made from %h and %w
// (both kept: %h is the residual stream, %w a parameter) just before the first of them.
//
// The recomputed node is the same op on the same inputs, so in f32 every loss bit is unchanged
// (tests/plan_parity.h runs the plans with it). The forward/backward boundary is the node that
// computes the loss (the program's loss output, followed back through its collectives). Only a
// planned run's rank program is rewritten: an unsharded run executes the global train graph,
// which the scheduled stage does not touch.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

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

void run_recompute(Compilation& c, const Options& o) {
  if (o.schedule.recompute == ScheduleOptions::Recompute::none) return;
  const int boundary = loss_node(c);
  if (boundary < 0) return;
  static const std::set<std::string> cheap{"rmsnorm", "layernorm", "swiglu",
                                           "gelu",    "rope",      "cast"};
  const ir::Graph& g = c.rank.graph;
  auto again_able = [&](int v) {
    const ir::Value& val = g.value(v);
    return val.kind == ir::ValueKind::node && val.producer < boundary &&
           cheap.count(g.node(val.producer).op) > 0;
  };
  std::vector<bool> reads_again(g.nodes().size(), false);  // backward nodes that read a copy
  for (const ir::Node& n : g.nodes())
    if (n.id > boundary)
      for (int v : n.inputs) reads_again[size_t(n.id)] = reads_again[size_t(n.id)] || again_able(v);
  if (std::find(reads_again.begin(), reads_again.end(), true) == reads_again.end()) return;

  Rewriter rw(c.rank);
  std::map<int, int> again;  // old forward value -> its recomputed new value
  // The new value a backward node reads for old value v: v's recomputed copy where it can be made
  // again, else v itself.
  std::function<int(int)> backward_read = [&](int v) -> int {
    if (!again_able(v)) return rw.map(v);
    if (auto it = again.find(v); it != again.end()) return it->second;
    const ir::Node& p = g.node(g.value(v).producer);
    std::vector<int> ins;
    for (int u : p.inputs) ins.push_back(backward_read(u));
    const std::vector<int> outs = rw.copy_with(p, ins, ".recompute");
    for (size_t i = 0; i < outs.size(); ++i) again[p.outputs[i]] = outs[i];
    return again.at(v);
  };
  for (const ir::Node& n : g.nodes()) {
    if (!reads_again[size_t(n.id)]) {
      rw.copy(n);
      continue;
    }
    std::vector<int> ins;
    for (int v : n.inputs) ins.push_back(backward_read(v));
    const std::vector<int> outs = rw.copy_with(n, ins);
    for (size_t i = 0; i < outs.size(); ++i) rw.alias(n.outputs[i], outs[i]);
  }
  c.rank = rw.finish();
}

}  // namespace

Pass recompute_pass() {
  return {"recompute",
          "make norms, activations, rope and casts again in the backward instead of keeping them "
          "([passes] recompute = \"selective\")",
          Stage::scheduled, run_recompute};
}

}  // namespace loom::passes
