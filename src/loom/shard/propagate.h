// Sharding propagation: from the tactics' annotations to a sharding for every value of the graph
// and a factor assignment for every node, using the ops' sharding rules (ops/sharding_rule.h).
//
// Each node is visited forward and backward until nothing changes. A visit gathers candidates: for
// every dim of every operand and result that is split, "its factor may take these axes", ranked by
// the annotation's priority (tactic order; propagated shardings after every explicit one; operands
// before results). Candidates are granted in rank order while they fit: the factor is splittable
// and still free, the axes are not taken by another factor of this node, and they divide the
// factor. The granted assignment then fixes how the node runs: each operand's required sharding,
// and each result's produced sharding (a result lacking a split factor is a partial sum over its
// axes). Forward, a result not annotated by a tactic takes its produced sharding; backward, an
// operand not annotated grows the splits its consumer asks for on dims that are still whole.
//
// Conflicts are never settled silently: wherever a value's sharding differs from what a consumer
// requires (or from what its producer produces), lowering inserts an explicit reshard. Correctness
// therefore never depends on the propagation's choices, only the amount of communication does.
//
// Invariant: after propagate(), every value's sharding passes check_sharding.
#pragma once

#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ops/sharding_rule.h"
#include "loom/shard/plan.h"

namespace loom::shard {

struct NodeSharding {
  std::vector<std::vector<std::string>> factor_axes;  // per factor of the op's rule
  std::vector<Sharding> operands;                     // required per operand
  std::vector<Sharding> results;                      // produced per result
};

struct Propagation {
  std::vector<Sharding> value;     // per value id: the sharding it is kept in
  std::vector<NodeSharding> node;  // per node id
  std::vector<bool> explicit_;     // per value id: set by a tactic
  int sweeps = 0;                  // forward+backward sweeps until the fixed point
  bool converged = false;
};

Propagation propagate(const ir::Graph& g, const Mesh& mesh, const Annotations& ann);

// What consumer `node` sees of its operand `i`: the annotation's `use` sharding (fsdp) unless the
// node updates that operand in place (the optimizer), else the value's sharding.
const Sharding& operand_view(const ir::Graph& g, const Propagation& p, const Annotations& ann,
                             const ir::Node& node, size_t i);

}  // namespace loom::shard
