// A plain f64 interpreter for forward graphs, built on the reference loops
// (kernels/cpu/reference.h, attention_ref.h). Tests use it as ground truth: forward outputs are
// compared with the executor's, and finite differences of its loss check every VJP. Rounding ops
// (cast) are the identity here: their gradient is defined as straight-through.
#pragma once

#include <map>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::testing {

// values: every graph input (params and states as doubles, i32 inputs as doubles holding integers).
// Evaluates nodes 0..last_node (all when -1) and returns every value's data, indexed by value id.
// Throws loom::Error for an op it has no reference for.
std::vector<std::vector<double>> eval_f64(const ir::Graph& g,
                                          const std::map<int, std::vector<double>>& inputs,
                                          int last_node = -1);

}  // namespace loom::testing
