// The IR verifier: checks a Graph against the op registry and returns diagnostics (empty = valid).
//
// Checks: every op is registered; every node's inputs are defined before it (node order is
// execution order); each node's output types are exactly what the op infers from its input types
// and attributes; value names are unique and graph outputs exist; an in-place op's overwritten
// input is read by no later node. Each diagnostic names the node, the op and the offending value.
#pragma once

#include <string>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::ops {

std::vector<std::string> verify(const ir::Graph& g);
// Throws loom::Error listing the diagnostics (prefixed by `source`) when the graph is invalid.
void verify_or_throw(const ir::Graph& g, const std::string& source);

}  // namespace loom::ops
