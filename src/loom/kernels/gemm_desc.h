// What a GEMM kernel is asked to compute, whatever the device: the CPU's (cpu/gemm.h, cpu/moe.cc)
// and the GPU's (cuda/kernels.h) take the same descriptions, and runtime/kernel_args.h makes them
// from a matmul or grouped_matmul node.
//
// GemmDesc: C (batch, M, N) = op(A) (batch, M, K) x op(B) (batch, K, N), op = transpose when ta /
// tb. A is stored (batch,M,K) or, when ta, (batch,K,M); B is (batch,K,N) or, when tb, (batch,N,K).
// a_dtype == b_dtype in {f32, bf16}; c_dtype in {f32, bf16}; accumulation is always f32. When
// accumulate is set, C += result (used for gradient accumulation), else C is overwritten.
//
// GroupedGemm (grouped_matmul, ops/moe.cc): per expert e, over the expert layout's G*S slot rows.
//   ta = 0: c (E,G,S,N) = a (E,G,S,K) op(b[e]), b (E,N,K) (tb) or (E,K,N)
//   ta = 1: c (E,M,N) = a (E,G,S,M)^T b (E,G,S,N)
// a and b both f32 or both bf16, c f32 or (bf16 inputs) bf16, overwritten.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels {

struct GemmDesc {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool ta = false, tb = false;
  DType ab_dtype = DType::f32;
  DType c_dtype = DType::f32;
  bool accumulate = false;
  bool operator==(const GemmDesc&) const = default;
};

struct GroupedGemm {
  int64_t E = 0, G = 0, S = 0, M = 0, N = 0, K = 0;  // ta = 0: M unused; ta = 1: K unused
  bool ta = false, tb = false;
  DType ab_dtype = DType::f32, c_dtype = DType::f32;
};

}  // namespace loom::kernels
