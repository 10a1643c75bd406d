// micro_batch (stage scheduled, last): under gradient accumulation, orders the rank program so that
// a micro-batch before the step's last is a prefix of it (pass.h's Accumulation). The prefix is
// every node the step's loss outputs or a gradient sum's assign depends on: the forward, the
// backward, the gradients' reductions and the sums' update. The rest (the mean gradients, clipping,
// AdamW, the parameters' write-backs and their collectives) follows in its own order. A step runs
// the prefix on micro-batches 1 .. k-1 and the whole program on the last.
//
// Moving the prefix's nodes ahead keeps every data dependency (a node needed by the prefix needs
// only prefix nodes). What it must not change is the order of a write in place and a read of the
// same memory (AdamW updating a parameter, a read of it); the pass checks that no prefix node reads
// or writes what an earlier non-prefix node wrote or read in place, and fails naming the node.
// Without accumulation the pass does nothing.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

// The values node n writes in place: an optimizer's operands it updates, an in-place op's inputs.
std::vector<int> written(const ir::Node& n) {
  std::vector<int> w;
  if (ops::has_trait(n.op, ops::Trait::optimizer))
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (i != 1 && i < 4) w.push_back(n.inputs[i]);  // adamw(p, g, m, v, ...): p, m, v
  for (auto [out, in] : ops::op_def(n.op).inplace) w.push_back(n.inputs[size_t(in)]);
  return w;
}

void run_micro_batch(Compilation& c, const Options& o) {
  if (!c.accumulation) return;
  const ir::Graph& g = c.rank.graph;
  std::vector<bool> need(g.nodes().size(), false), live(g.values().size(), false);
  // the roots: the loss outputs (as the program returns them) and each sum's assign
  const std::vector<int> losses = c.model.loss_outputs();
  const std::vector<int>& outs = c.model.graph.outputs();
  for (size_t i = 0; i < outs.size(); ++i)
    if (std::find(losses.begin(), losses.end(), outs[i]) != losses.end())
      live[size_t(c.rank.outputs[i])] = true;
  std::vector<bool> sum(g.values().size(), false);
  for (auto [p, s] : c.accumulation->sums) {
    const int local = c.rank.local[size_t(s)];
    if (local < 0)
      throw Error(fmt::format("{}: the gradient sum %{} has no block in the rank program", o.source,
                              c.model.graph.value(s).name));
    sum[size_t(local)] = true;
  }
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const ir::Node& n = g.nodes()[i];
    bool keep = n.op == ir::Op::assign && sum[size_t(n.inputs[0])];
    for (int v : n.outputs) keep = keep || live[size_t(v)];
    if (!keep) continue;
    need[i] = true;
    for (int v : n.inputs) live[size_t(v)] = true;
  }
  // a prefix node must not pass a non-prefix node that writes what it touches, or reads what it
  // writes
  std::vector<bool> touched_later(g.values().size(), false);  // by an earlier non-prefix node
  std::vector<bool> written_later(g.values().size(), false);
  int64_t prefix = 0;
  for (const ir::Node& n : g.nodes()) {
    if (!need[size_t(n.id)]) {
      for (int v : n.inputs) touched_later[size_t(v)] = true;
      for (int v : written(n)) written_later[size_t(v)] = true;
      continue;
    }
    ++prefix;
    for (int v : n.inputs)
      if (written_later[size_t(v)])
        throw Error(
            fmt::format("{}: micro_batch: %{} reads %{}, which the optimizer's part of the "
                        "step writes before it",
                        o.source, g.value(n.outputs[0]).name, g.value(v).name));
    for (int v : written(n))
      if (touched_later[size_t(v)])
        throw Error(
            fmt::format("{}: micro_batch: %{} writes %{}, which the optimizer's part of "
                        "the step reads before it",
                        o.source, g.value(n.outputs[0]).name, g.value(v).name));
  }
  c.accumulation->micro_nodes = prefix;
  if (prefix == int64_t(g.nodes().size())) return;
  bool ordered = true;  // already a prefix: no rewrite
  for (size_t i = 0; i < g.nodes().size(); ++i)
    ordered = ordered && need[i] == (int64_t(i) < prefix);
  if (ordered) return;
  Rewriter rw(c.rank);
  for (const ir::Node& n : g.nodes())
    if (need[size_t(n.id)]) rw.copy(n);
  for (const ir::Node& n : g.nodes())
    if (!need[size_t(n.id)]) rw.copy(n);
  c.rank = rw.finish();
}

}  // namespace

Pass micro_batch_pass() {
  return {
      "micro_batch",
      "gradient accumulation: a micro-batch before the step's last made a prefix of the program",
      Stage::scheduled, run_micro_batch};
}

}  // namespace loom::passes
