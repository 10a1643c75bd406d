// Rebuilding a per-rank program. The scheduled stage's passes merge, split and reorder nodes, which
// the append-only ir::Graph cannot do in place, so a pass builds a new program: a Rewriter starts
// from the old program's inputs (same names, kinds and types), the pass copies or replaces the old
// nodes in the order it wants them, and finish() returns the new program with `local` and `outputs`
// pointing at the new ids of the same computations.
//
// Example (bucket.cc): three all-gathers become one concat, one all_gather, one split and three
// reshapes; the pass emits those with the Builder, then alias()es each old all-gather output to
// its reshape, and copies every other node as it comes, mapping inputs through the old->new map.
//
// Invariant: an old value is mapped once (copied, or aliased to a new value of its exact type);
// finish() fails (LOOM_CHECK, a pass bug) when an old value that an output or `local` names was
// never mapped. The verifier runs on the result like after every pass (pipeline.h).
//
// Program::origin goes through: a copied node keeps its old node's global node; a node the pass
// makes otherwise has none (-1) unless the pass sets one (set_origin).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loom/ops/builder.h"
#include "loom/passes/pass.h"
#include "loom/shard/lower.h"

namespace loom::passes {

class Rewriter {
 public:
  explicit Rewriter(const shard::Program& old);

  const ir::Graph& old_graph() const { return old_.graph; }
  ir::Graph& graph() { return next_.graph; }
  ops::Builder& builder() { return b_; }

  // The new id of an old value; -1 while it is not mapped yet.
  int map(int old_value) const { return map_[size_t(old_value)]; }
  // Whether every input of old node n is mapped (n can be emitted now).
  bool ready(const ir::Node& n) const;
  // Appends a copy of old node n (same op, attributes, output names and types) over the mapped
  // inputs, and maps its outputs.
  void copy(const ir::Node& n);
  // Appends a copy of old node n over the given new inputs, its outputs named as n's plus
  // `suffix`; returns the new outputs, unmapped (alias them, or keep them beside the old ones).
  std::vector<int> copy_with(const ir::Node& n, const std::vector<int>& inputs,
                             const std::string& suffix = "");
  // The old value is computed by new_value from now on.
  void alias(int old_value, int new_value);
  // The global node new node `node` counts as made by (Program::origin).
  void set_origin(int node, int origin);
  // Old node n's global node, or -1.
  int origin_of(int old_node) const;
  // The new program; `old` is left as it was.
  shard::Program finish();

 private:
  const shard::Program& old_;
  shard::Program next_;
  ops::Builder b_{next_.graph};
  std::vector<int> map_;
};

// Every value's readers in g: value -> (node, input slot).
using Uses = std::map<int, std::vector<std::pair<int, int>>>;
Uses uses_of(const ir::Graph& g);
// The value whose gradient collective n reduces (reduce_scatter or all_reduce): the parameter
// when an optimizer reads n's output (or its cast to f32: passes/reduce_cast.cc) as the
// parameter's gradient, or the gradient sum it is added into (add(sum, gradient), gradient
// accumulation); -1 for any other collective.
int reduced_gradient_owner(const ir::Graph& g, const ir::Node& n, const Uses& uses);

// Per value of c.rank.graph: the parameter group (an index into c.model.roles.blocks) of the
// parameter it is, or -1 (not a parameter, or one no group names). What bucket and recompute
// select by.
std::vector<int> param_groups(const Compilation& c);

}  // namespace loom::passes
