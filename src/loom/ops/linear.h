// The 2-D (or batched) view a matmul node (or a grouped_matmul) computes, shared by its cost, its
// kernels and the simulator.
#pragma once

#include <cstdint>

#include "loom/ir/graph.h"

namespace loom::ops {

struct MatmulDims {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool ta = false, tb = false;
};
MatmulDims matmul_dims(const ir::Graph& g, const ir::Node& n);
// A grouped_matmul (ops/moe.cc) as the batched matmul it computes: batch = experts, every slot
// counted (the kernel skips empty ones; how many is known only when the step runs).
MatmulDims grouped_matmul_dims(const ir::Graph& g, const ir::Node& n);

}  // namespace loom::ops
