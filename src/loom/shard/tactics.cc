// The tactic table (tactic.h), the context tactics apply through, and apply_tactics (plan.h),
// which runs a plan's tactics in order.
#include <fmt/format.h>

#include <algorithm>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

TacticContext::TacticContext(const ir::Graph& g, const Plan& plan, const ir::Roles& roles,
                             Annotations& ann)
    : g_(g),
      plan_(plan),
      roles_(roles),
      ann_(ann),
      params_(g.inputs_of_kind(ir::ValueKind::param)) {
  for (const ir::Node& n : g.nodes())
    if (ops::has_trait(n.op, ops::Trait::optimizer))
      edges_[n.inputs[0]] = {n.inputs[1], n.inputs[2], n.inputs[3]};
}

void TacticContext::start(int index, const Tactic& t) {
  index_ = index;
  by_ = fmt::format("{} tactics[{}] ({})", plan_.where, index, t.kind);
  axis_ = t.axis;
  if (!plan_.mesh.has(axis_))
    throw Error(
        fmt::format("{}: axis '{}' is not in the mesh {}", by_, axis_, plan_.mesh.to_string()),
        "name one of the mesh's axes, or add it to [plan] mesh");
}

const TacticContext::OptimizerEdges* TacticContext::edges(int p) const {
  auto it = edges_.find(p);
  return it == edges_.end() ? nullptr : &it->second;
}

Sharding TacticContext::current(int v) const {
  auto it = ann_.find(v);
  return it != ann_.end() ? it->second.sharding
                          : Sharding::replicated(g_.value(v).type.shape.size());
}

Sharding TacticContext::with_axis(int v, Sharding s, size_t d) const {
  if (s.uses(axis_)) {
    auto it = ann_.find(v);
    throw Error(
        fmt::format("{}: value %{} is already split over axis '{}'{}", by_, g_.value(v).name, axis_,
                    it != ann_.end() ? " by " + it->second.by : ""),
        "two tactics may not split one value over the same axis; use another axis");
  }
  s.dims[d].push_back(axis_);
  return s;
}

int TacticContext::divisible_dim(int v, const Sharding& s) const {
  const Shape& shape = g_.value(v).type.shape;
  const int64_t n = plan_.mesh.axis_size(axis_);
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] % (s.ways(plan_.mesh, d) * n) == 0) return int(d);
  return -1;
}

void TacticContext::set(int v, Sharding s) {
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

void TacticContext::split(int v, size_t d, bool open) {
  set(v, with_axis(v, current(v), d));
  if (open) ann_[v].open = true;  // once open, a later tactic's split keeps it open
}

void TacticContext::split_with_state(int p, size_t d) {
  split(p, d);
  if (ann_[p].has_use) ann_[p].use = with_axis(p, ann_[p].use, d);
  if (const OptimizerEdges* e = edges(p))
    for (int x : {e->grad, e->m, e->v}) split(x, d);
}

const std::vector<TacticDef>& tactic_defs() {
  static const std::vector<TacticDef> t{data_tactic(),   fsdp_tactic(),     zero1_tactic(),
                                        zero2_tactic(),  megatron_tactic(), sequence_tactic(),
                                        expert_tactic(), shard_tactic(),    pipeline_tactic()};
  return t;
}

const TacticDef* find_tactic(std::string_view kind) {
  for (const TacticDef& d : tactic_defs())
    if (d.name == kind) return &d;
  return nullptr;
}

std::vector<std::string> tactic_kinds() {
  std::vector<std::string> k;
  for (const TacticDef& d : tactic_defs()) k.emplace_back(d.name);
  return k;
}

Annotations apply_tactics(const ir::Graph& g, const Plan& plan, const ir::Roles& roles) {
  Annotations ann;
  TacticContext c(g, plan, roles, ann);
  for (size_t ti = 0; ti < plan.tactics.size(); ++ti) {
    const Tactic& t = plan.tactics[ti];
    c.start(int(ti), t);
    const TacticDef* def = find_tactic(t.kind);
    if (!def) {
      std::string all;
      for (const std::string& k : tactic_kinds()) all += (all.empty() ? "" : ", ") + k;
      throw Error(fmt::format("{}: unknown tactic kind '{}'", c.by(), t.kind), "one of: " + all);
    }
    def->apply(c, t);
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
