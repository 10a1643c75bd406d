// The 2-D (or batched) view a matmul node computes, shared by its cost, its kernels and the
// simulator.
#pragma once

#include <cstdint>

#include "loom/ir/graph.h"

namespace loom::ops {

struct MatmulDims {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool ta = false, tb = false;
};
MatmulDims matmul_dims(const ir::Graph& g, const ir::Node& n);

}  // namespace loom::ops
