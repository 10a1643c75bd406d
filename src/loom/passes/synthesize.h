// The reductions the synthesize pass (synthesize.cc) rewrites, for `loom plan --explain` too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ops/builder.h"
#include "loom/shard/sharding.h"
#include "loom/sim/p2.h"

namespace loom::passes {

// One reduction of a per-rank program: an all_reduce over a mesh axis, or a chain of them over
// several (each read by the next alone: a value that was a partial sum over all of them).
struct Reduction {
  std::vector<int> nodes;         // the all_reduce nodes, in order
  std::vector<std::string> axes;  // their axes
  int64_t numel = 0;
  double bytes = 0;  // of the buffer
};
std::vector<Reduction> reductions(const ir::Graph& g, const shard::Mesh& mesh);

// Emits `p`'s steps on x, a 1-D buffer, through b (the collectives over the sub-groups
// sim::p2::group_spec names, each named `name` plus .ar, .rs or .ag); returns the reduced buffer.
// Throws loom::Error for a reduce or broadcast step (no runtime op).
int emit_program(ops::Builder& b, int x, const shard::Mesh& mesh,
                 const std::vector<sim::p2::Factor>& f, const sim::p2::Program& p,
                 const std::string& name);

}  // namespace loom::passes
