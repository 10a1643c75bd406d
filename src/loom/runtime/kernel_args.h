// What a device's kernel table (cpu_dispatch.cc, cuda/cuda_dispatch.cc) reads off a node to call a
// kernel: its inputs' and outputs' types and element counts, and typed views of their pointers.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"
#include "loom/ir/graph.h"

namespace loom::runtime::kernel_args {

inline const ir::TensorType& in_t(const ir::Graph& g, const ir::Node& n, int i) {
  return g.value(n.inputs[size_t(i)]).type;
}
inline const ir::TensorType& out_t(const ir::Graph& g, const ir::Node& n, int i) {
  return g.value(n.outputs[size_t(i)]).type;
}
inline int64_t in_n(const ir::Graph& g, const ir::Node& n, int i) {
  return numel(in_t(g, n, i).shape);
}
inline int64_t out_n(const ir::Graph& g, const ir::Node& n, int i) {
  return numel(out_t(g, n, i).shape);
}
inline float* F(void* p) { return static_cast<float*>(p); }
inline const float* CF(void* p) { return static_cast<const float*>(p); }
inline const int32_t* I(void* p) { return static_cast<const int32_t*>(p); }
inline const bf16* BF(void* p) { return static_cast<const bf16*>(p); }

}  // namespace loom::runtime::kernel_args
