// The built-in tactics (plan.h). Each reads the annotations earlier tactics left and adds its own.
//
// The optimizer's structure is read from the graph, not from names: every optimizer node (trait
// optimizer: adamw) ties a parameter to its gradient and moments (inputs p, g, m, v), so the ZeRO
// tactics find what to split by following those edges.
#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/shard/plan.h"

namespace loom::shard {

namespace {

struct OptimizerEdges {
  int grad = -1, m = -1, v = -1;
};

std::map<int, OptimizerEdges> optimizer_edges(const ir::Graph& g) {
  std::map<int, OptimizerEdges> r;
  for (const ir::Node& n : g.nodes())
    if (ops::has_trait(n.op, ops::Trait::optimizer))
      r[n.inputs[0]] = {n.inputs[1], n.inputs[2], n.inputs[3]};
  return r;
}

class Applier {
 public:
  Applier(const ir::Graph& g, const Plan& plan, Annotations& ann) : g_(g), plan_(plan), ann_(ann) {}

  void set_tactic(int index, const Tactic& t) {
    index_ = index;
    by_ = fmt::format("{} tactics[{}] ({})", plan_.where, index, t.kind);
    axis_ = t.axis;
    if (!plan_.mesh.has(axis_))
      throw Error(
          fmt::format("{}: axis '{}' is not in the mesh {}", by_, axis_, plan_.mesh.to_string()),
          "name one of the mesh's axes, or add it to [plan] mesh");
  }

  Sharding current(int v) const {
    auto it = ann_.find(v);
    return it != ann_.end() ? it->second.sharding
                            : Sharding::replicated(g_.value(v).type.shape.size());
  }

  // `s` with this tactic's axis appended to dim d; an error if the value already uses the axis.
  Sharding with_axis(int v, Sharding s, size_t d) const {
    if (s.uses(axis_)) {
      auto it = ann_.find(v);
      throw Error(
          fmt::format("{}: value %{} is already split over axis '{}'{}", by_, g_.value(v).name,
                      axis_, it != ann_.end() ? " by " + it->second.by : ""),
          "two tactics may not split one value over the same axis; use another axis");
    }
    s.dims[d].push_back(axis_);
    return s;
  }

  // The first dim of v that its current split and this axis still divide, or -1.
  int divisible_dim(int v, const Sharding& s) const {
    const Shape& shape = g_.value(v).type.shape;
    const int64_t n = plan_.mesh.axis_size(axis_);
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] % (s.ways(plan_.mesh, d) * n) == 0) return int(d);
    return -1;
  }

  void set(int v, Sharding s) {
    if (auto e = check_sharding(g_.value(v).type.shape, s, plan_.mesh); !e.empty())
      throw Error(fmt::format("{}: value %{} ({}) cannot be split as {}: {}", by_, g_.value(v).name,
                              ir::type_str(g_.value(v).type), to_string(s), e),
                  "choose a mesh axis size that divides the dim");
    Annotation& a = ann_[v];
    if (a.by.empty()) {
      a.priority = index_;
      a.by = by_;
    }
    a.sharding = std::move(s);
  }

  // Appends this tactic's axis to dim d of v.
  void split(int v, size_t d) { set(v, with_axis(v, current(v), d)); }

  const ir::Graph& g_;
  const Plan& plan_;
  Annotations& ann_;
  int index_ = 0;
  std::string by_, axis_;
};

}  // namespace

const std::vector<std::string>& tactic_kinds() {
  static const std::vector<std::string> k{"data",     "fsdp",     "zero1",  "zero2",
                                          "megatron", "sequence", "expert", "shard"};
  return k;
}

Annotations apply_tactics(const ir::Graph& g, const Plan& plan, const ir::Roles& roles) {
  Annotations ann;
  Applier ap(g, plan, ann);
  const auto edges = optimizer_edges(g);
  const auto params = g.inputs_of_kind(ir::ValueKind::param);
  for (size_t ti = 0; ti < plan.tactics.size(); ++ti) {
    const Tactic& t = plan.tactics[ti];
    ap.set_tactic(int(ti), t);
    if (t.kind == "data") {
      for (int v : roles.batch_inputs) ap.split(v, 0);
    } else if (t.kind == "fsdp" || t.kind == "zero1" || t.kind == "zero2") {
      for (int p : params) {
        Sharding before = ap.current(p);
        int d = ap.divisible_dim(p, before);
        if (d < 0) continue;  // too small to split: stays whole (a norm weight of odd size)
        Sharding after = ap.with_axis(p, before, size_t(d));
        auto e = edges.find(p);
        if (t.kind == "fsdp") {
          Sharding use = ann.count(p) && ann[p].has_use ? ann[p].use : before;
          ap.set(p, after);
          ann[p].has_use = true;
          ann[p].use = use;
        }
        if (e == edges.end()) continue;  // a graph without an optimizer (gradients only)
        ap.set(e->second.m, ap.with_axis(e->second.m, ap.current(e->second.m), size_t(d)));
        ap.set(e->second.v, ap.with_axis(e->second.v, ap.current(e->second.v), size_t(d)));
        // zero1 keeps the gradient whole (all-reduced); zero2 and fsdp reduce-scatter it
        if (t.kind == "zero1")
          ap.set(e->second.grad, before);
        else
          ap.set(e->second.grad, ap.with_axis(e->second.grad, before, size_t(d)));
      }
    } else if (t.kind == "megatron") {
      auto split_pair = [&](const ir::ParallelWeight& w) {
        const int p = w.value;
        const size_t d = size_t(w.dim);
        ap.split(p, d);
        if (ann[p].has_use) ann[p].use = ap.with_axis(p, ann[p].use, d);
        auto e = edges.find(p);
        if (e == edges.end()) return;
        for (int x : {e->second.grad, e->second.m, e->second.v}) ap.split(x, d);
      };
      for (const auto& w : roles.column_parallel) split_pair(w);
      for (const auto& w : roles.row_parallel) split_pair(w);
      if (roles.column_parallel.empty() && roles.row_parallel.empty())
        throw Error(
            fmt::format("{}: this model declares no column- or row-parallel weight", ap.by_),
            "megatron splits the weights a model declares tensor-parallel: Llama's "
            "q/k/v/o and gate/up/down projections, GPT-2's c_attn, c_proj and MLP");
    } else if (t.kind == "expert") {
      // Expert parallelism (GShard): each rank of the axis holds E/n of every MoE layer's experts
      // (the stacked expert weights split on dim 0, their gradients and moments alike) and its own
      // sequences of the batch, as data parallelism would. Propagation then meets the two splits
      // at the experts' grouped GEMMs: the tokens' slots (E,B,S,C), split by sequence, reach the
      // weights' expert split through an all-to-all, and come back through another before
      // combine (tests/ir_text/expert.ir).
      if (roles.experts.empty())
        throw Error(fmt::format("{}: this model has no experts", ap.by_),
                    "expert splits the experts of Mixture-of-Experts layers: set [model] moe = { "
                    "experts = ... }");
      for (int v : roles.batch_inputs)
        if (!ap.current(v).uses(ap.axis_)) ap.split(v, 0);  // unless `data` split it already
      for (int p : roles.experts) {
        ap.split(p, 0);
        if (ann[p].has_use) ann[p].use = ap.with_axis(p, ann[p].use, 0);
        auto e = edges.find(p);
        if (e == edges.end()) continue;
        for (int x : {e->second.grad, e->second.m, e->second.v}) ap.split(x, 0);
      }
    } else if (t.kind == "sequence") {
      std::vector<int> stream;
      for (const ir::Node& n : g.nodes())
        if (ops::has_trait(n.op, ops::Trait::norm)) {
          stream.push_back(n.inputs[0]);
          stream.push_back(n.outputs[0]);
        }
      std::sort(stream.begin(), stream.end());
      stream.erase(std::unique(stream.begin(), stream.end()), stream.end());
      for (int v : stream)
        if (g.value(v).type.shape.size() >= 3) ap.split(v, 1);
    } else if (t.kind == "shard") {
      int matched = 0;
      for (const ir::Value& v : g.values()) {
        if (fnmatch(t.pattern.c_str(), v.name.c_str(), 0) != 0) continue;
        ++matched;
        if (t.dim < 0 || t.dim >= int64_t(v.type.shape.size()))
          throw Error(fmt::format("{}: value %{} ({}) has no dim {}", ap.by_, v.name,
                                  ir::type_str(v.type), t.dim));
        ap.split(v.id, size_t(t.dim));
      }
      if (!matched)
        throw Error(fmt::format("{}: pattern '{}' matches no value", ap.by_, t.pattern),
                    "`loom inspect CONFIG --stage train` lists the value names");
    } else {
      throw Error(fmt::format("{}: unknown tactic kind '{}'", ap.by_, t.kind),
                  "one of: data, fsdp, zero1, zero2, megatron, sequence, expert, shard");
    }
  }
  // every other graph input is whole on every rank
  for (const ir::Value& v : g.values())
    if (v.kind != ir::ValueKind::node && !ann.count(v.id)) {
      Annotation& a = ann[v.id];
      a.sharding = Sharding::replicated(v.type.shape.size());
      a.priority = int(plan.tactics.size());
      a.by = "the default (whole on every rank)";
    }
  return ann;
}

}  // namespace loom::shard
