// Tactics as a table: each built-in tactic is one TacticDef in its own file under shard/tactics/,
// and tactic_defs() lists them once. The config parser, apply_tactics, the error messages and plan
// search all read this table; nothing else names a tactic kind.
//
// A tactic's `apply` sets shardings through a TacticContext: the values it reads come from the
// model's roles (ir/roles.h) and the optimizer's edges (every Trait::optimizer node ties a
// parameter to its gradient and moments), never from parameter names (`shard`'s pattern is the
// user's own).
//
// Example: `{ kind = "fsdp", axis = "data" }` on a mesh {data = 2} finds fsdp_tactic() by name;
// its apply appends `data` to the first dim of each parameter that 2 divides (and to its gradient
// and moments), and records that every consumer but the optimizer sees the parameter whole, so
// lowering all-gathers it before use.
//
// Invariant: on one mesh axis, tactic b after tactic a is refused exactly when b.not_after names a
// (a value would be split over the axis twice); tests/tactic_table_test.cc checks every pair
// against what apply does, so the declaration cannot drift from the behaviour, and plan search can
// prune by it.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "loom/shard/plan.h"

namespace loom::shard {

// What a tactic's apply works with: the graph, the roles, the annotations so far, and the
// current tactic's axis and name for messages.
class TacticContext {
 public:
  // The parameter's optimizer inputs (adamw's p, g, m, v): -1 where the graph has no optimizer.
  struct OptimizerEdges {
    int grad = -1, m = -1, v = -1;
  };

  TacticContext(const ir::Graph& g, const Plan& plan, const ir::Roles& roles, Annotations& ann);

  // Starts tactic `index` of the plan: sets axis() and by(); throws loom::Error for an axis the
  // mesh lacks.
  void start(int index, const Tactic& t);

  const ir::Graph& graph() const { return g_; }
  const ir::Roles& roles() const { return roles_; }
  const Plan& plan() const { return plan_; }
  Annotations& annotations() { return ann_; }
  const std::string& axis() const { return axis_; }
  const std::string& by() const { return by_; }  // "[plan] tactics[1] (megatron)"
  const std::vector<int>& params() const { return params_; }
  // The optimizer edges of parameter p; null when p has no optimizer node (a gradients-only graph).
  const OptimizerEdges* edges(int p) const;

  // v's sharding so far (replicated when no tactic set it).
  Sharding current(int v) const;
  // `s` with this tactic's axis appended to dim d; an error if the value already uses the axis.
  Sharding with_axis(int v, Sharding s, size_t d) const;
  // The first dim of v that its current split and this axis still divide, or -1.
  int divisible_dim(int v, const Sharding& s) const;
  // Sets v's sharding (checked against its shape: an error naming the value and the dim).
  void set(int v, Sharding s);
  // Appends this tactic's axis to dim d of v; `open`: the dims no tactic splits are left to
  // propagation (Annotation::open).
  void split(int v, size_t d, bool open = false);
  // split(p, d), also on the view its consumers see (fsdp's `use`) when it has one, and on its
  // gradient and moments.
  void split_with_state(int p, size_t d);

 private:
  const ir::Graph& g_;
  const Plan& plan_;
  const ir::Roles& roles_;
  Annotations& ann_;
  std::vector<int> params_;
  std::map<int, OptimizerEdges> edges_;
  int index_ = 0;
  std::string by_, axis_;
};

struct TacticDef {
  std::string_view name;     // [plan] tactics' `kind`
  std::string_view summary;  // what it splits, one line
  std::string_view selects;  // the roles (or graph structure) it reads
  // The tactics it cannot follow on the same mesh axis: they split a value it splits too (shard's
  // depends on its pattern, so it lists none and none lists it).
  std::vector<std::string_view> not_after;
  bool takes_pattern = false;  // reads `pattern` and `dim` (required then, refused otherwise)
  void (*apply)(TacticContext& c, const Tactic& t) = nullptr;
};

// Every built-in tactic, in the order docs/plans.md lists them.
const std::vector<TacticDef>& tactic_defs();
// The tactic named `kind`; null when none is.
const TacticDef* find_tactic(std::string_view kind);

// Each tactic's definition (shard/tactics/<file>.cc).
TacticDef data_tactic();
TacticDef fsdp_tactic();
TacticDef zero1_tactic();
TacticDef zero2_tactic();
TacticDef megatron_tactic();
TacticDef sequence_tactic();
TacticDef expert_tactic();
TacticDef shard_tactic();
TacticDef pipeline_tactic();

}  // namespace loom::shard
