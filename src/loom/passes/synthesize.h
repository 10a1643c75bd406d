// The reductions the synthesize pass (synthesize.cc) rewrites, for `loom plan --explain` too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/shard/sharding.h"

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

}  // namespace loom::passes
