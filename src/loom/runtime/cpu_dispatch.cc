// The CPU's kernel table (device.h): for each op, a kernel that reads the node's shapes and
// attributes and calls kernels/cpu. This is the only file that knows both the IR and the CPU kernel
// signatures.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "loom/core/error.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/ops/op.h"
#include "loom/runtime/device.h"
#include "loom/runtime/kernel_args.h"

namespace loom::runtime {

namespace {

namespace k = loom::kernels::cpu;
using ir::Op;

using namespace kernel_args;

// ids in [0, V); -1 too where the node reads ids made relative to its block of a split vocabulary
// (attribute masked: ops/sharding_rule.h's index_into_block).
void check_ids(const ir::Graph& g, const ir::Node& n, int i, const int32_t* ids, int64_t count,
               int64_t V) {
  const int32_t lo = n.attr_int("masked", 0) ? -1 : 0;
  for (int64_t j = 0; j < count; ++j)
    if (ids[j] < lo || ids[j] >= V)
      throw Error(fmt::format("%{}: token id {} at position {} is outside the vocabulary [0, {})",
                              g.value(n.inputs[i]).name, ids[j], j, V));
}

// A Mixture-of-Experts routing pair (experts, slots) from anywhere but moe_router (an IR file):
// experts in [0,E), slots in [-1,S). `slots` may be null (only the experts are read).
void check_routing(const ir::Graph& g, const ir::Node& n, int ei, int si, const int32_t* experts,
                   const int32_t* slots, int64_t count, int64_t E, int64_t S) {
  for (int64_t j = 0; j < count; ++j) {
    if (experts[j] < 0 || experts[j] >= E)
      throw Error(fmt::format("%{}: expert {} at position {} is outside [0, {})",
                              g.value(n.inputs[size_t(ei)]).name, experts[j], j, E));
    if (slots && (slots[j] < -1 || slots[j] >= S))
      throw Error(fmt::format("%{}: slot {} at position {} is outside [-1, {})",
                              g.value(n.inputs[size_t(si)]).name, slots[j], j, S));
  }
}

KernelTable make_table() {
  KernelTable t(DeviceKind::cpu);
  t.add(Op::add, [](auto& g, auto& n, auto in, auto out) {
    if (in_t(g, n, 0).shape == in_t(g, n, 1).shape)
      k::add(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0));
    else {
      int64_t C = in_n(g, n, 1);
      k::add_bias(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0) / std::max<int64_t>(C, 1), C);
    }
  });
  t.add(Op::mul, [](auto& g, auto& n, auto in, auto out) {
    k::mul(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0));
  });
  t.add(Op::scale, [](auto& g, auto& n, auto in, auto out) {
    k::scale(CF(in[0]), float(n.attr_float("s")), F(out[0]), out_n(g, n, 0));
  });
  t.add(Op::mul_scalar, [](auto& g, auto& n, auto in, auto out) {
    k::mul_scalar(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0));
  });
  t.add(Op::gelu, [](auto& g, auto& n, auto in, auto out) {
    k::gelu_fwd(CF(in[0]), F(out[0]), out_n(g, n, 0));
  });
  t.add(Op::gelu_bwd, [](auto& g, auto& n, auto in, auto out) {
    k::gelu_bwd(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0));
  });
  t.add(Op::swiglu, [](auto& g, auto& n, auto in, auto out) {
    if (in_t(g, n, 0).dtype == DType::f32)
      k::swiglu_fwd(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0));
    else
      k::swiglu_fwd_bf16(BF(in[0]), BF(in[1]), static_cast<bf16*>(out[0]), out_n(g, n, 0));
  });
  t.add(Op::swiglu_bwd, [](auto& g, auto& n, auto in, auto out) {
    if (in_t(g, n, 0).dtype == DType::f32)
      k::swiglu_bwd(CF(in[0]), CF(in[1]), CF(in[2]), F(out[0]), F(out[1]), out_n(g, n, 0));
    else
      k::swiglu_bwd_bf16(BF(in[0]), BF(in[1]), BF(in[2]), static_cast<bf16*>(out[0]),
                         static_cast<bf16*>(out[1]), out_n(g, n, 0));
  });
  t.add(Op::cast, [](auto& g, auto& n, auto in, auto out) {
    DType from = in_t(g, n, 0).dtype, to = out_t(g, n, 0).dtype;
    int64_t e = out_n(g, n, 0);
    if (from == to)
      std::memmove(out[0], in[0], size_t(e) * dtype_size(to));
    else if (from == DType::f32)
      k::cast_f32_bf16(CF(in[0]), static_cast<bf16*>(out[0]), e);
    else
      k::cast_bf16_f32(static_cast<const bf16*>(in[0]), F(out[0]), e);
  });
  t.add(Op::sum,
        [](auto& g, auto& n, auto in, auto out) { k::sum(CF(in[0]), F(out[0]), in_n(g, n, 0)); });
  t.add(Op::sumsq,
        [](auto& g, auto& n, auto in, auto out) { k::sumsq(CF(in[0]), F(out[0]), in_n(g, n, 0)); });
  t.add(Op::sum_rows, [](auto& g, auto& n, auto in, auto out) {
    int64_t C = out_n(g, n, 0);
    k::sum_rows(CF(in[0]), F(out[0]), C ? in_n(g, n, 0) / C : 0, C);
  });
  t.add(Op::broadcast_scalar, [](auto& g, auto& n, auto in, auto out) {
    std::fill_n(F(out[0]), out_n(g, n, 0), *CF(in[0]));
  });
  t.add(Op::broadcast_rows, [](auto& g, auto& n, auto in, auto out) {
    int64_t C = in_n(g, n, 0), rows = C ? out_n(g, n, 0) / C : 0;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(F(out[0]) + r * C, in[0], size_t(C) * 4);
  });
  t.add(Op::assign, [](auto& g, auto& n, auto in, auto out) {
    if (out[0] != in[1])
      std::memmove(out[0], in[1], size_t(out_n(g, n, 0)) * dtype_size(out_t(g, n, 0).dtype));
  });
  t.add(Op::fill, [](auto& g, auto& n, auto in, auto out) {
    float v = float(n.attr_float("value", 0.0));
    int64_t e = out_n(g, n, 0);
    if (out_t(g, n, 0).dtype == DType::f32)
      std::fill_n(F(out[0]), e, v);
    else
      std::fill_n(static_cast<bf16*>(out[0]), e, f32_to_bf16(v));
  });
  t.add(Op::positions, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = out_t(g, n, 0).shape;
    int64_t T = s.back(), rows = T ? numel(s) / T : 0;
    auto* p = static_cast<int32_t*>(out[0]);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < T; ++t) p[r * T + t] = int32_t(t);
  });
  t.add(Op::positions_at, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = out_t(g, n, 0).shape;
    const int64_t T = s.back(), rows = T ? numel(s) / T : 0, start = *I(in[0]);
    auto* p = static_cast<int32_t*>(out[0]);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < T; ++t) p[r * T + t] = int32_t(start + t);
  });
  t.add(Op::matmul, [](auto& g, auto& n, auto in, auto out) {
    k::gemm(gemm_desc(g, n), in[0], in[1], out[0]);
  });
  t.add(Op::embedding, [](auto& g, auto& n, auto in, auto out) {
    int64_t N = in_n(g, n, 0), V = in_t(g, n, 1).shape[0], C = in_t(g, n, 1).shape[1];
    check_ids(g, n, 0, I(in[0]), N, V);
    k::embedding_fwd(I(in[0]), CF(in[1]), F(out[0]), N, C);
  });
  t.add(Op::embedding_bwd, [](auto& g, auto& n, auto in, auto out) {
    int64_t N = in_n(g, n, 0), V = out_t(g, n, 0).shape[0], C = out_t(g, n, 0).shape[1];
    check_ids(g, n, 0, I(in[0]), N, V);
    k::embedding_bwd(I(in[0]), CF(in[1]), F(out[0]), N, V, C);
  });
  t.add(Op::rmsnorm, [](auto& g, auto& n, auto in, auto out) {
    int64_t C = in_n(g, n, 1), N = in_n(g, n, 0) / C;
    k::rmsnorm_fwd(CF(in[0]), CF(in[1]), F(out[0]), F(out[1]), N, C, float(n.attr_float("eps")));
  });
  t.add(Op::rmsnorm_bwd, [](auto& g, auto& n, auto in, auto out) {
    int64_t C = in_n(g, n, 2), N = in_n(g, n, 1) / C;
    k::rmsnorm_bwd(CF(in[0]), CF(in[1]), CF(in[2]), CF(in[3]), F(out[0]), F(out[1]), N, C);
  });
  t.add(Op::layernorm, [](auto& g, auto& n, auto in, auto out) {
    int64_t C = in_n(g, n, 1), N = in_n(g, n, 0) / C;
    k::layernorm_fwd(CF(in[0]), CF(in[1]), CF(in[2]), F(out[0]), F(out[1]), F(out[2]), N, C,
                     float(n.attr_float("eps")));
  });
  t.add(Op::layernorm_bwd, [](auto& g, auto& n, auto in, auto out) {
    int64_t C = in_n(g, n, 2), N = in_n(g, n, 1) / C;
    k::layernorm_bwd(CF(in[0]), CF(in[1]), CF(in[2]), CF(in[3]), CF(in[4]), F(out[0]), F(out[1]),
                     F(out[2]), N, C);
  });
  t.add(Op::rope, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = in_t(g, n, 0).shape;
    k::rope(CF(in[0]), F(out[0]), s[0], s[1], s[2], s[3], float(n.attr_float("theta")),
            int(n.attr_int("sign", 1)));
  });
  t.add(Op::rope_at, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = in_t(g, n, 0).shape;
    const int64_t start = *I(in[1]);
    if (start < 0)
      throw Error(fmt::format("%{}: first position {} < 0", g.value(n.outputs[0]).name, start));
    k::rope(CF(in[0]), F(out[0]), s[0], s[1], s[2], s[3], float(n.attr_float("theta")), 1, start);
  });
  t.add(Op::cached_attention, [](auto& g, auto& n, auto in, auto out) {
    const Shape &q = in_t(g, n, 0).shape, &kc = in_t(g, n, 3).shape;
    const float sc = float(n.attr_float("scale"));
    const int64_t start = *I(in[5]);
    LOOM_CHECK(out[1] == in[3] && out[2] == in[4]) << "cached_attention must run in place";
    if (in_t(g, n, 0).dtype == DType::f32) {
      k::cached_attention<float>(CF(in[0]), CF(in[1]), CF(in[2]), F(out[1]), F(out[2]), F(out[0]),
                                 q[0], q[1], kc[1], start, q[2], kc[2], q[3], sc);
    } else {
      using B = const bf16*;
      auto O = [&](int i) { return static_cast<bf16*>(out[i]); };
      k::cached_attention<bf16>(B(in[0]), B(in[1]), B(in[2]), O(1), O(2), O(0), q[0], q[1], kc[1],
                                start, q[2], kc[2], q[3], sc);
    }
  });
  t.add(Op::attention, [](auto& g, auto& n, auto in, auto out) {
    const Shape &q = in_t(g, n, 0).shape, &kv = in_t(g, n, 1).shape;
    float sc = float(n.attr_float("scale"));
    if (in_t(g, n, 0).dtype == DType::f32)
      k::attention_fwd<float>(CF(in[0]), CF(in[1]), CF(in[2]), F(out[0]), F(out[1]), q[0], q[1],
                              q[2], kv[2], q[3], sc);
    else {
      using B = const bf16*;
      k::attention_fwd<bf16>(B(in[0]), B(in[1]), B(in[2]), static_cast<bf16*>(out[0]), F(out[1]),
                             q[0], q[1], q[2], kv[2], q[3], sc);
    }
  });
  t.add(Op::attention_bwd, [](auto& g, auto& n, auto in, auto out) {
    const Shape &q = in_t(g, n, 1).shape, &kv = in_t(g, n, 2).shape;
    float sc = float(n.attr_float("scale"));
    if (in_t(g, n, 1).dtype == DType::f32)
      k::attention_bwd<float>(CF(in[0]), CF(in[1]), CF(in[2]), CF(in[3]), CF(in[4]), CF(in[5]),
                              F(out[0]), F(out[1]), F(out[2]), q[0], q[1], q[2], kv[2], q[3], sc);
    else {
      using B = const bf16*;
      auto O = [&](int i) { return static_cast<bf16*>(out[i]); };
      k::attention_bwd<bf16>(B(in[0]), B(in[1]), B(in[2]), B(in[3]), B(in[4]), CF(in[5]), O(0),
                             O(1), O(2), q[0], q[1], q[2], kv[2], q[3], sc);
    }
  });
  t.add(Op::cross_entropy, [](auto& g, auto& n, auto in, auto out) {
    int64_t V = in_t(g, n, 0).shape.back(), N = in_n(g, n, 1);
    check_ids(g, n, 1, I(in[1]), N, V);
    if (n.inputs.size() == 3)
      k::cross_entropy_split(CF(in[0]), I(in[1]), CF(in[2]), in_t(g, n, 2).shape[0], F(out[0]),
                             F(out[1]), N, V, n.attr_int("rows", N));
    else
      k::cross_entropy(CF(in[0]), I(in[1]), F(out[0]), F(out[1]), N, V, n.attr_int("rows", N));
  });
  t.add(Op::softmax_stats, [](auto& g, auto& n, auto in, auto out) {
    int64_t V = in_t(g, n, 0).shape.back(), N = in_n(g, n, 1);
    check_ids(g, n, 1, I(in[1]), N, V);
    k::softmax_stats(CF(in[0]), I(in[1]), F(out[0]), N, V);
  });
  t.add(Op::grouped_matmul, [](auto& g, auto& n, auto in, auto out) {
    k::grouped_gemm(grouped_gemm_desc(g, n), in[0], in[1], out[0]);
  });
  t.add(Op::moe_router, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = in_t(g, n, 0).shape;
    k::moe_router(CF(in[0]), F(out[0]), static_cast<int32_t*>(out[1]),
                  static_cast<int32_t*>(out[2]), F(out[3]), F(out[4]), F(out[5]), F(out[6]), s[0],
                  s[1], s[2], n.attr_int("top_k"), n.attr_int("capacity"));
  });
  t.add(Op::moe_router_bwd, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = in_t(g, n, 0).shape;
    const int64_t K = in_t(g, n, 1).shape[2];
    check_routing(g, n, 2, -1, I(in[2]), nullptr, s[0] * s[1] * K, s[2], 1);
    k::moe_router_bwd(CF(in[0]), CF(in[1]), I(in[2]), CF(in[3]), CF(in[4]), *CF(in[5]), F(out[0]),
                      s[0], s[1], s[2], K);
  });
  t.add(Op::moe_dispatch, [](auto& g, auto& n, auto in, auto out) {
    const Shape &x = in_t(g, n, 0).shape, &e = out_t(g, n, 0).shape;
    const int64_t K = in_t(g, n, 1).shape[2];
    check_routing(g, n, 1, 2, I(in[1]), I(in[2]), x[0] * x[1] * K, e[0], e[2]);
    const float* gates = n.inputs.size() == 4 ? CF(in[3]) : nullptr;
    if (in_t(g, n, 0).dtype == DType::f32)
      k::moe_dispatch<float>(CF(in[0]), I(in[1]), I(in[2]), gates, F(out[0]), x[0], x[1], x[2],
                             e[0], K, e[2]);
    else
      k::moe_dispatch<bf16>(BF(in[0]), I(in[1]), I(in[2]), gates, static_cast<bf16*>(out[0]), x[0],
                            x[1], x[2], e[0], K, e[2]);
  });
  t.add(Op::moe_combine, [](auto& g, auto& n, auto in, auto out) {
    const Shape &e = in_t(g, n, 0).shape, &r = in_t(g, n, 1).shape;
    check_routing(g, n, 1, 2, I(in[1]), I(in[2]), r[0] * r[1] * r[2], e[0], e[2]);
    const float* gates = n.inputs.size() == 4 ? CF(in[3]) : nullptr;
    if (in_t(g, n, 0).dtype == DType::f32)
      k::moe_combine<float>(CF(in[0]), I(in[1]), I(in[2]), gates, F(out[0]), r[0], r[1], e[3], e[0],
                            r[2], e[2]);
    else
      k::moe_combine<bf16>(BF(in[0]), I(in[1]), I(in[2]), gates, F(out[0]), r[0], r[1], e[3], e[0],
                           r[2], e[2]);
  });
  t.add(Op::moe_gate_grad, [](auto& g, auto& n, auto in, auto out) {
    const Shape &e = in_t(g, n, 0).shape, &r = in_t(g, n, 2).shape;
    check_routing(g, n, 2, 3, I(in[2]), I(in[3]), r[0] * r[1] * r[2], e[0], e[2]);
    const bool xf = in_t(g, n, 0).dtype == DType::f32, yf = in_t(g, n, 1).dtype == DType::f32;
    auto run = [&](auto* ye, auto* y) {
      k::moe_gate_grad(ye, y, I(in[2]), I(in[3]), F(out[0]), r[0], r[1], e[3], e[0], r[2], e[2]);
    };
    if (xf && yf) run(CF(in[0]), CF(in[1]));
    if (xf && !yf) run(CF(in[0]), BF(in[1]));
    if (!xf && yf) run(BF(in[0]), CF(in[1]));
    if (!xf && !yf) run(BF(in[0]), BF(in[1]));
  });
  t.add(Op::reshape, [](auto& g, auto& n, auto in, auto out) {
    if (in[0] != out[0])
      std::memmove(out[0], in[0], size_t(out_n(g, n, 0)) * dtype_size(out_t(g, n, 0).dtype));
  });
  // wait's output is its in-flight input's memory; the executor blocks on the collective before
  // this runs (executor.cc), so there is nothing left to do
  t.add(Op::wait, [](auto&, auto&, auto, auto) {});
  t.add(Op::transpose, [](auto& g, auto& n, auto in, auto out) {
    const Shape& s = in_t(g, n, 0).shape;
    std::vector<int> perm;
    for (int64_t p : n.attr_ints("perm")) perm.push_back(int(p));
    k::transpose(in[0], out[0], s.data(), perm.data(), int(s.size()),
                 int(dtype_size(in_t(g, n, 0).dtype)));
  });
  // split and concat along an axis: along the last dim of the (rows, dim * inner) view
  t.add(Op::split, [](auto& g, auto& n, auto in, auto out) {
    const ops::AxisView v = ops::axis_view(n, in_t(g, n, 0).shape);
    std::vector<int64_t> sizes = n.attr_ints("sizes");
    for (int64_t& s : sizes) s *= v.inner;
    k::split_last(in[0], out, sizes.data(), int(sizes.size()), v.rows,
                  int(dtype_size(in_t(g, n, 0).dtype)));
  });
  t.add(Op::concat, [](auto& g, auto& n, auto in, auto out) {
    const ops::AxisView v = ops::axis_view(n, out_t(g, n, 0).shape);
    std::vector<int64_t> sizes;
    std::vector<const void*> xs;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      sizes.push_back(in_t(g, n, int(i)).shape[size_t(v.axis)] * v.inner);
      xs.push_back(in[i]);
    }
    k::concat_last(xs.data(), out[0], sizes.data(), int(sizes.size()), v.rows,
                   int(dtype_size(out_t(g, n, 0).dtype)));
  });
  t.add(Op::adamw, [](auto& g, auto& n, auto in, auto out) {
    LOOM_CHECK(out[0] == in[0] && out[1] == in[2] && out[2] == in[3]) << "adamw must run in place";
    k::adamw(F(in[0]), CF(in[1]), F(in[2]), F(in[3]), CF(in[4]), CF(in[5]), in_n(g, n, 0),
             float(n.attr_float("beta1")), float(n.attr_float("beta2")), float(n.attr_float("eps")),
             float(n.attr_float("wd")));
  });
  t.add(Op::clip_coef, [](auto& g, auto& n, auto in, auto out) {
    k::clip_coef(CF(in[0]), F(out[0]), F(out[1]), float(n.attr_float("max_norm")));
  });
  return t;
}

}  // namespace

const KernelTable& cpu_kernels() {
  static const KernelTable t = make_table();
  return t;
}

}  // namespace loom::runtime
