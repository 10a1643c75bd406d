// A program's compute kernels as JSON, one entry per distinct (op, attributes, operand types):
// what `loom plan --kernels` lists for a GPU to time (bench/gpu/torch_kernels.py), what `loom
// bench --kernels-out` writes with the times of Loom's own kernels, and what `loom calibrate
// --import` reads back as a cluster's profile (calibrate/import.cc).
//
//   {"op": "matmul", "attrs": {...}, "inputs": [{"dtype": "bf16", "shape": [...]}, ...],
//    "outputs": [...], "dtype": "bf16", "bytes": B, "flops": F,
//    "gemm": {"ta": 0, "tb": 1, "m": M, "n": N, "k": K, "batch": 1}}   (gemm: matmuls only)
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "loom/ir/graph.h"

namespace loom::sim {

// Whether the node is a kernel of its own: not a view, a collective or a collective's completion.
bool listed_kernel(const ir::Node& n);
// The node's entry (above).
nlohmann::json kernel_json(const ir::Graph& g, const ir::Node& n);
// What makes two entries the same kernel: the op, attributes and operand types (not the costs).
std::string kernel_signature(const nlohmann::json& entry);

}  // namespace loom::sim
