// pipeline_micro_batches (stage forward, after build_model): under a pipeline tactic, one step's
// m micro-batches as one global graph, and the stage of every parameter.
//
// build_model built the forward for b = B/m rows (micro_batch_rows); every node that depends on a
// batch input is copied m - 1 times over new batch inputs (named "<input>.mb<k>"), the parameters
// and everything made from them alone (a bf16 weight's cast) shared. The copies are appended so
// that micro-batch 0 is the last in the graph: autodiff differentiates last to first, so each
// parameter's gradient is summed in micro-batch order (dW0 + dW1, then + dW2, ...) and a schedule
// that runs micro-batch 0's backward first frees its contribution early. The template itself is
// micro-batch m - 1. The loss, the cross-entropy are the micro-batches' mean, an MoE model's router
// counts their sum: the same loss as the whole batch (B rows) in one graph, as gradient
// accumulation's.
//
// Chunks: the parameter groups (roles.blocks, in forward order: the embedding, each block, the
// head) are cut into p * v contiguous runs (p stages of v chunks each), minimising the largest
// run's cost, where a group costs the elements of its matmul weights (an embedding table is a
// lookup and costs nothing). Chunk c runs on stage c % p (interleaved: Megatron-LM's virtual
// pipeline stages).
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {

namespace {

// The pipeline tactic's index in the plan, for messages.
std::string where(const Options& o) {
  const shard::Tactic* t = shard::find_pipeline(o.plan);
  const size_t i = size_t(t - o.plan.tactics.data());
  return fmt::format("{} tactics[{}] (pipeline)", o.plan.where, i);
}

// The elements of a group's weights that a matmul reads (through casts): its compute.
int64_t group_cost(const ir::Graph& g, const ir::ParamGroup& group) {
  std::vector<bool> matmul_weight(g.values().size(), false);
  const std::vector<int> root = ops::param_roots(g);
  for (const ir::Node& n : g.nodes())
    if (n.op == ir::Op::matmul || n.op == ir::Op::grouped_matmul)
      for (int in : n.inputs)
        if (root[size_t(in)] >= 0) matmul_weight[size_t(root[size_t(in)])] = true;
  int64_t cost = 0;
  for (int p : group.params)
    if (matmul_weight[size_t(p)]) cost += numel(g.value(p).type.shape);
  return cost;
}

// Contiguous runs of `cost` into k parts, the largest part as small as it can be: each part's
// first index (DP over prefixes; n is the model's groups, a few hundred at most).
std::vector<size_t> balanced_cuts(const std::vector<int64_t>& cost, size_t k) {
  const size_t n = cost.size();
  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  const int64_t inf = std::numeric_limits<int64_t>::max();
  // best[j][i]: the smallest largest part of the first i groups cut into j parts
  std::vector<std::vector<int64_t>> best(k + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<size_t>> from(k + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t j = 1; j <= k; ++j)
    for (size_t i = j; i <= n; ++i)
      for (size_t s = j - 1; s < i; ++s) {
        if (best[j - 1][s] == inf) continue;
        const int64_t worst = std::max(best[j - 1][s], prefix[i] - prefix[s]);
        if (worst < best[j][i]) best[j][i] = worst, from[j][i] = s;
      }
  std::vector<size_t> starts(k);
  for (size_t j = k, i = n; j > 0; --j) {
    starts[j - 1] = from[j][i];
    i = from[j][i];
  }
  return starts;
}

void assign_chunks(Compilation& c, const Options& o, Pipelining& pl) {
  const auto& groups = c.model.roles.blocks;
  if (int64_t(groups.size()) < pl.chunks())
    throw Error(
        fmt::format(
            "{}: {} stages (axis '{}'){} but the model has {} parameter groups "
            "(the embedding, {} blocks, the head) to cut at",
            where(o), pl.stages, pl.axis,
            pl.virtual_stages > 1 ? fmt::format(" of {} chunks each", pl.virtual_stages) : "",
            groups.size(), groups.size() - 2),
        "fewer stages or virtual stages, or more layers");
  std::vector<int64_t> cost;
  for (const ir::ParamGroup& grp : groups) cost.push_back(group_cost(c.model.graph, grp));
  const std::vector<size_t> starts = balanced_cuts(cost, size_t(pl.chunks()));
  for (size_t s = 0; s < starts.size(); ++s) {
    const size_t end = s + 1 < starts.size() ? starts[s + 1] : groups.size();
    pl.group_of_chunk.push_back(groups[starts[s]].name +
                                (end - starts[s] > 1 ? "-" + groups[end - 1].name : ""));
    for (size_t i = starts[s]; i < end; ++i)
      for (int p : groups[i].params) pl.param_chunk[p] = int64_t(s);
  }
}

void run_pipeline_micro_batches(Compilation& c, const Options& o) {
  const shard::Tactic* t = shard::find_pipeline(o.plan);
  if (!t) return;
  if (!o.plan.mesh.has(t->axis))
    throw Error(fmt::format("{}: axis '{}' is not in the mesh {}", where(o), t->axis,
                            o.plan.mesh.to_string()));
  Pipelining pl;
  pl.axis = t->axis;
  pl.schedule = t->schedule;
  pl.stages = o.plan.mesh.axis_size(t->axis);
  pl.microbatches = shard::pipeline_microbatches(o.plan, *t);
  pl.virtual_stages = shard::pipeline_virtual_stages(*t);
  if (pl.virtual_stages > 1 && pl.microbatches % pl.stages)
    throw Error(fmt::format("{}: the interleaved schedule runs micro-batches in groups of the "
                            "stages, and microbatches = {} is not a multiple of {} (axis '{}')",
                            where(o), pl.microbatches, pl.stages, pl.axis),
                fmt::format("microbatches = {}",
                            pl.stages * std::max<int64_t>(1, pl.microbatches / pl.stages)));
  assign_chunks(c, o, pl);

  ir::Graph& g = c.model.graph;
  models::ModelGraph& m = c.model;
  const int64_t mb = pl.microbatches;
  const size_t template_nodes = g.nodes().size();
  pl.inputs.assign(size_t(mb), {});
  pl.inputs[size_t(mb - 1)] = m.roles.batch_inputs;
  // per micro-batch k (the template is m - 1): each template value's copy
  std::vector<std::vector<int>> copy(static_cast<size_t>(mb));
  for (int64_t k = mb - 2; k >= 0; --k) {
    std::vector<int>& map = copy[size_t(k)];
    map.resize(g.values().size());
    for (size_t v = 0; v < map.size(); ++v) map[v] = int(v);
    std::vector<bool> dep(g.values().size(), false);
    for (int v : m.roles.batch_inputs) {
      const ir::Value& in = g.value(v);
      map[size_t(v)] = g.add_input(fmt::format("{}.mb{}", in.name, k), in.type, in.kind);
      dep[size_t(v)] = true;
      pl.inputs[size_t(k)].push_back(map[size_t(v)]);
    }
    for (size_t i = 0; i < template_nodes; ++i) {
      const ir::Node n = g.node(int(i));  // a copy: add_node may move the node list
      bool any = false;
      for (int in : n.inputs) any = any || dep[size_t(in)];
      if (!any) continue;
      std::vector<int> ins;
      for (int in : n.inputs) ins.push_back(map[size_t(in)]);
      std::vector<ir::TensorType> types;
      std::vector<std::string> names;
      for (int out : n.outputs) {
        types.push_back(g.value(out).type);
        names.push_back(g.unique_name(fmt::format("{}.mb{}", g.value(out).name, k)));
      }
      const std::vector<int> outs = g.add_node(n.op, ins, n.attrs, types, names);
      for (size_t j = 0; j < outs.size(); ++j) {
        map[size_t(n.outputs[j])] = outs[j];
        dep[size_t(n.outputs[j])] = true;
      }
    }
  }
  // the step's outputs over the micro-batches, in micro-batch order
  ops::Builder b(g);
  auto of = [&](int v, int64_t k) { return k == mb - 1 ? v : copy[size_t(k)][size_t(v)]; };
  auto combine = [&](int v, bool mean) {
    if (v < 0 || mb == 1) return v;
    const std::string name = g.value(v).name;
    int s = of(v, 0);
    for (int64_t k = 1; k < mb; ++k) s = b.add(s, of(v, k), fmt::format("{}.sum{}", name, k));
    return mean ? b.scale(s, 1.0 / double(mb), name + ".mean") : s;
  };
  const int loss = m.loss, ce = m.ce_loss;
  m.loss = combine(loss, true);
  m.ce_loss = ce == loss ? m.loss : combine(ce, true);
  m.moe_kept = combine(m.moe_kept, false);
  m.moe_routed = combine(m.moe_routed, false);
  std::vector<int> batch;
  for (const auto& in : pl.inputs) batch.insert(batch.end(), in.begin(), in.end());
  m.roles.batch_inputs = batch;
  g.set_outputs(m.loss_outputs());
  pl.forward_nodes = int64_t(g.nodes().size());
  c.pipelining = std::move(pl);
}

}  // namespace

std::string Pipelining::groups_of_stage(int64_t s) const {
  std::string r;
  for (int64_t c = s; c < chunks(); c += stages)
    r += (r.empty() ? "" : ", ") + group_of_chunk[size_t(c)];
  return r;
}

int64_t micro_batch_rows(const Options& o) {
  const shard::Tactic* t = shard::find_pipeline(o.plan);
  if (!t) return o.batch;
  if (o.kind != StepKind::train && o.kind != StepKind::eval)
    throw Error(fmt::format("{}: a pipeline runs training and evaluation steps; this one "
                            "returns logits or gradients whole",
                            where(o)),
                "run it without the [plan]");
  const int64_t mb = shard::pipeline_microbatches(o.plan, *t);
  if (o.batch % mb)
    throw Error(fmt::format("{}: microbatches = {} does not divide [train] batch_size = {}",
                            where(o), mb, o.batch),
                "batch_size a multiple of microbatches (B/m rows per micro-batch)");
  if (o.accumulate)
    throw Error(fmt::format("{}: [train] grad_accum > 1 beside a pipeline, whose micro-batches "
                            "are the accumulation",
                            where(o)),
                "raise batch_size and microbatches instead of grad_accum");
  return o.batch / mb;
}

Pass pipeline_micro_batches_pass() {
  return {"pipeline_micro_batches",
          "under a pipeline tactic, the forward once per micro-batch over shared parameters",
          Stage::forward, run_pipeline_micro_batches};
}

}  // namespace loom::passes
