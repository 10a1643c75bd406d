// Lowering: the global graph and its propagated shardings become the per-rank Program, a graph over
// local shapes in which collectives (ops/collective.cc) move data wherever a consumer needs another
// sharding than the value has.
//
// A reshard from sharding S to T is emitted as, in order:
//   1. each partial axis of S that T does not keep: reduce_scatter over it onto the dim where T
//   adds
//      exactly that axis next, else all_reduce;
//   2. an axis that leaves the end of one dim's split for the end of another's ({model,_} ->
//      {_,model}): all_to_all;
//   3. each split T does not keep, last axis first: all_gather;
//   4. each split T adds: shard_slice (local, no communication).
// Example (fsdp): a parameter kept as {data,_} and used whole becomes `all_gather {axis = "data",
// dim = 0}` before its first use; its gradient, produced as {_,_|sum=data} and kept as {data,_},
// becomes `reduce_scatter {axis = "data", dim = 0}`.
// Each (value, target sharding) is resharded once and reused by every consumer that needs it: an
// fsdp parameter is gathered once, before its first reader (the scheduled stage's reshard pass
// gathers it again for each later reader: [passes] reshard_after_forward).
// An op that updates a graph input in place (adamw) but had to run on a resharded copy writes the
// result back: reshard to the input's sharding, then `assign`.
//
// The Program is the same on every rank (SPMD): which block a rank holds is decided at run time
// from its coordinates, so `loom inspect --stage lowered --rank R` differs only in its header.
#pragma once

#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/shard/propagate.h"

namespace loom::shard {

struct Program {
  ir::Graph graph{"rank"};
  std::vector<int> local;    // global value id -> local id of the value as kept (-1: none)
  std::vector<int> outputs;  // local ids of the global graph's outputs, partial sums reduced
  // Per local node, the global node whose lowering made it (its operands' reshards included), -1
  // for the outputs' final reductions; the scheduled stage's rewrites keep it for the nodes they
  // copy (passes/rewrite.h), and recompute gives a node made again its backward reader's.
  std::vector<int> origin;
};

Program lower(const ir::Graph& g, const Mesh& mesh, const Propagation& p);

// IR text of the sharded global graph: every value's type followed by its sharding.
std::string print_sharded(const ir::Graph& g, const Propagation& p);

}  // namespace loom::shard
