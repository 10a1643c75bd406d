// What a device's kernel table (cpu_dispatch.cc, cuda/cuda_dispatch.cc) reads off a node to call a
// kernel: its inputs' and outputs' types and element counts, typed views of their pointers, and the
// GEMM descriptions of matmul and grouped_matmul nodes.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"
#include "loom/ir/graph.h"
#include "loom/kernels/gemm_desc.h"
#include "loom/ops/linear.h"

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

// A matmul node's GEMM.
inline kernels::GemmDesc gemm_desc(const ir::Graph& g, const ir::Node& n) {
  const ops::MatmulDims d = ops::matmul_dims(g, n);
  kernels::GemmDesc gd;
  gd.batch = d.batch;
  gd.M = d.M;
  gd.N = d.N;
  gd.K = d.K;
  gd.ta = d.ta;
  gd.tb = d.tb;
  gd.ab_dtype = in_t(g, n, 0).dtype;
  gd.c_dtype = out_t(g, n, 0).dtype;
  return gd;
}

// A grouped_matmul node's per-expert GEMMs.
inline kernels::GroupedGemm grouped_gemm_desc(const ir::Graph& g, const ir::Node& n) {
  const Shape &a = in_t(g, n, 0).shape, &b = in_t(g, n, 1).shape;
  kernels::GroupedGemm d;
  d.E = a[0];
  d.G = a[1];
  d.S = a[2];
  d.ta = n.attr_int("ta", 0);
  d.tb = n.attr_int("tb", 0);
  if (d.ta) {
    d.M = a[3];
    d.N = b[3];
  } else {
    d.K = a[3];
    d.N = d.tb ? b[1] : b[2];
  }
  d.ab_dtype = in_t(g, n, 0).dtype;
  d.c_dtype = out_t(g, n, 0).dtype;
  return d;
}

}  // namespace loom::runtime::kernel_args
