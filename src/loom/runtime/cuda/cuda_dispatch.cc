// The CUDA kernel table (device.h): for each op, a kernel that reads the node's shapes and
// attributes and queues kernels/cuda's kernel on the device's stream. It mirrors cpu_dispatch.cc
// op for op. What the CPU table checks on values (token ids, MoE routing of an IR file) is not
// checked here: the values are on the GPU. The step runner checks a batch's token ids on the host
// before they go up; a program that routes from an IR file runs on the CPU.
//
// Ops without a CUDA kernel, on purpose: the collectives (all_gather, reduce_scatter, shard_slice,
// shard_index, all_reduce, all_to_all), which run on communicators (collectives.h): multi-GPU runs
// wait for NCCL behind the same nodes; and what only a plan's lowering makes (softmax_stats, the
// vocabulary-parallel cross_entropy), as plans run on the CPU.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdlib>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cuda_check.h"
#include "loom/kernels/cuda/kernels.h"
#include "loom/ops/op.h"
#include "loom/runtime/cuda/cuda_device.h"
#include "loom/runtime/kernel_args.h"

namespace loom::runtime {

namespace {

namespace k = loom::kernels::cuda;
using ir::Op;
using namespace kernel_args;
using Fn = void (*)(const ir::Graph&, const ir::Node&, void* const*, void* const*, k::Stream);

bf16* BO(void* p) { return static_cast<bf16*>(p); }
bool f32_in(const ir::Graph& g, const ir::Node& n, int i) {
  return in_t(g, n, i).dtype == DType::f32;
}

KernelTable make_table(k::Stream s) {
  KernelTable t(DeviceKind::cuda);
  // Every kernel names its op and node when its launch (or, with LOOM_CUDA_SYNC=1, its run) fails.
  auto add = [&](Op op, Fn fn) {
    t.add(op, [fn, s](const ir::Graph& g, const ir::Node& n, void* const* in, void* const* out) {
      try {
        fn(g, n, in, out, s);
        if (cuda_sync_each()) k::check(int(cudaStreamSynchronize(s)), "running the kernel");
      } catch (const Error& e) {
        const std::string v = n.outputs.empty() ? "" : "%" + g.value(n.outputs[0]).name + " = ";
        throw Error(fmt::format("cuda kernel of {}{}(...): {}", v, n.op, e.what()));
      }
    });
  };
  add(Op::add, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    if (in_t(g, n, 0).shape == in_t(g, n, 1).shape)
      k::add(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0), s);
    else {
      const int64_t C = in_n(g, n, 1);
      k::add_bias(CF(in[0]), CF(in[1]), F(out[0]), C ? out_n(g, n, 0) / C : 0, C, s);
    }
  });
  add(Op::mul, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::mul(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0), s);
  });
  add(Op::scale, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::scale(CF(in[0]), float(n.attr_float("s")), F(out[0]), out_n(g, n, 0), s);
  });
  add(Op::mul_scalar, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::mul_scalar(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0), s);
  });
  add(Op::gelu, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::gelu_fwd(CF(in[0]), F(out[0]), out_n(g, n, 0), s);
  });
  add(Op::gelu_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::gelu_bwd(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0), s);
  });
  add(Op::swiglu, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    if (f32_in(g, n, 0))
      k::swiglu_fwd(CF(in[0]), CF(in[1]), F(out[0]), out_n(g, n, 0), s);
    else
      k::swiglu_fwd_bf16(BF(in[0]), BF(in[1]), BO(out[0]), out_n(g, n, 0), s);
  });
  add(Op::swiglu_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    if (f32_in(g, n, 0))
      k::swiglu_bwd(CF(in[0]), CF(in[1]), CF(in[2]), F(out[0]), F(out[1]), out_n(g, n, 0), s);
    else
      k::swiglu_bwd_bf16(BF(in[0]), BF(in[1]), BF(in[2]), BO(out[0]), BO(out[1]), out_n(g, n, 0),
                         s);
  });
  add(Op::cast, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const DType from = in_t(g, n, 0).dtype, to = out_t(g, n, 0).dtype;
    const int64_t e = out_n(g, n, 0);
    if (from == to)
      k::copy(out[0], in[0], e * int64_t(dtype_size(to)), s);
    else if (from == DType::f32)
      k::cast_f32_bf16(CF(in[0]), BO(out[0]), e, s);
    else
      k::cast_bf16_f32(BF(in[0]), F(out[0]), e, s);
  });
  add(Op::sum, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::sum(CF(in[0]), F(out[0]), in_n(g, n, 0), s);
  });
  add(Op::sumsq, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::sumsq(CF(in[0]), F(out[0]), in_n(g, n, 0), s);
  });
  add(Op::sum_rows, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t C = out_n(g, n, 0);
    k::sum_rows(CF(in[0]), F(out[0]), C ? in_n(g, n, 0) / C : 0, C, s);
  });
  add(Op::broadcast_scalar, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::broadcast_scalar(CF(in[0]), F(out[0]), out_n(g, n, 0), s);
  });
  add(Op::broadcast_rows, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t C = in_n(g, n, 0);
    k::broadcast_rows(CF(in[0]), F(out[0]), C ? out_n(g, n, 0) / C : 0, C, s);
  });
  add(Op::assign, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    if (out[0] != in[1])
      k::copy(out[0], in[1], out_n(g, n, 0) * int64_t(dtype_size(out_t(g, n, 0).dtype)), s);
  });
  add(Op::fill, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::fill(out[0], float(n.attr_float("value", 0.0)), out_n(g, n, 0),
            int(dtype_size(out_t(g, n, 0).dtype)), s);
  });
  add(Op::positions, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& sh = out_t(g, n, 0).shape;
    const int64_t T = sh.back();
    k::positions(static_cast<int32_t*>(out[0]), T ? numel(sh) / T : 0, T, nullptr, s);
  });
  add(Op::positions_at, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& sh = out_t(g, n, 0).shape;
    const int64_t T = sh.back();
    k::positions(static_cast<int32_t*>(out[0]), T ? numel(sh) / T : 0, T, I(in[0]), s);
  });
  add(Op::matmul, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::gemm(gemm_desc(g, n), in[0], in[1], out[0], s);
  });
  add(Op::embedding, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t N = in_n(g, n, 0), C = in_t(g, n, 1).shape[1];
    k::embedding_fwd(I(in[0]), CF(in[1]), F(out[0]), N, C, s);
  });
  add(Op::embedding_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t N = in_n(g, n, 0), V = out_t(g, n, 0).shape[0], C = out_t(g, n, 0).shape[1];
    k::embedding_bwd(I(in[0]), CF(in[1]), F(out[0]), N, V, C, s);
  });
  add(Op::rmsnorm, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t C = in_n(g, n, 1), N = in_n(g, n, 0) / C;
    k::rmsnorm_fwd(CF(in[0]), CF(in[1]), F(out[0]), F(out[1]), N, C, float(n.attr_float("eps")), s);
  });
  add(Op::rmsnorm_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t C = in_n(g, n, 2), N = in_n(g, n, 1) / C;
    k::rmsnorm_bwd(CF(in[0]), CF(in[1]), CF(in[2]), CF(in[3]), F(out[0]), F(out[1]), N, C, s);
  });
  add(Op::layernorm, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t C = in_n(g, n, 1), N = in_n(g, n, 0) / C;
    k::layernorm_fwd(CF(in[0]), CF(in[1]), CF(in[2]), F(out[0]), F(out[1]), F(out[2]), N, C,
                     float(n.attr_float("eps")), s);
  });
  add(Op::layernorm_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const int64_t C = in_n(g, n, 2), N = in_n(g, n, 1) / C;
    k::layernorm_bwd(CF(in[0]), CF(in[1]), CF(in[2]), CF(in[3]), CF(in[4]), F(out[0]), F(out[1]),
                     F(out[2]), N, C, s);
  });
  add(Op::rope, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& x = in_t(g, n, 0).shape;
    k::rope(CF(in[0]), F(out[0]), x[0], x[1], x[2], x[3], float(n.attr_float("theta")),
            int(n.attr_int("sign", 1)), nullptr, s);
  });
  add(Op::rope_at, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& x = in_t(g, n, 0).shape;
    k::rope(CF(in[0]), F(out[0]), x[0], x[1], x[2], x[3], float(n.attr_float("theta")), 1, I(in[1]),
            s);
  });
  add(Op::cached_attention, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape &q = in_t(g, n, 0).shape, &kc = in_t(g, n, 3).shape;
    const float sc = float(n.attr_float("scale"));
    LOOM_CHECK(out[1] == in[3] && out[2] == in[4]) << "cached_attention must run in place";
    if (f32_in(g, n, 0))
      k::cached_attention<float>(CF(in[0]), CF(in[1]), CF(in[2]), F(out[1]), F(out[2]), F(out[0]),
                                 q[0], q[1], kc[1], I(in[5]), q[2], kc[2], q[3], sc, s);
    else
      k::cached_attention<bf16>(BF(in[0]), BF(in[1]), BF(in[2]), BO(out[1]), BO(out[2]), BO(out[0]),
                                q[0], q[1], kc[1], I(in[5]), q[2], kc[2], q[3], sc, s);
  });
  add(Op::attention, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape &q = in_t(g, n, 0).shape, &kv = in_t(g, n, 1).shape;
    const float sc = float(n.attr_float("scale"));
    if (f32_in(g, n, 0))
      k::attention_fwd<float>(CF(in[0]), CF(in[1]), CF(in[2]), F(out[0]), F(out[1]), q[0], q[1],
                              q[2], kv[2], q[3], sc, s);
    else
      k::attention_fwd<bf16>(BF(in[0]), BF(in[1]), BF(in[2]), BO(out[0]), F(out[1]), q[0], q[1],
                             q[2], kv[2], q[3], sc, s);
  });
  add(Op::attention_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape &q = in_t(g, n, 1).shape, &kv = in_t(g, n, 2).shape;
    const float sc = float(n.attr_float("scale"));
    if (f32_in(g, n, 1))
      k::attention_bwd<float>(CF(in[0]), CF(in[1]), CF(in[2]), CF(in[3]), CF(in[4]), CF(in[5]),
                              F(out[0]), F(out[1]), F(out[2]), q[0], q[1], q[2], kv[2], q[3], sc,
                              s);
    else
      k::attention_bwd<bf16>(BF(in[0]), BF(in[1]), BF(in[2]), BF(in[3]), BF(in[4]), CF(in[5]),
                             BO(out[0]), BO(out[1]), BO(out[2]), q[0], q[1], q[2], kv[2], q[3], sc,
                             s);
  });
  add(Op::cross_entropy, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    if (n.inputs.size() != 2)
      throw Error(
          fmt::format("%{}: the vocabulary-parallel cross_entropy (a plan's megatron) has "
                      "no CUDA kernel: plans run on the CPU",
                      g.value(n.outputs[0]).name));
    const int64_t V = in_t(g, n, 0).shape.back(), N = in_n(g, n, 1);
    k::cross_entropy(CF(in[0]), I(in[1]), F(out[0]), F(out[1]), N, V, n.attr_int("rows", N), s);
  });
  add(Op::grouped_matmul, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::grouped_gemm(grouped_gemm_desc(g, n), in[0], in[1], out[0], s);
  });
  add(Op::moe_router, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& x = in_t(g, n, 0).shape;
    k::moe_router(CF(in[0]), F(out[0]), static_cast<int32_t*>(out[1]),
                  static_cast<int32_t*>(out[2]), F(out[3]), F(out[4]), F(out[5]), F(out[6]), x[0],
                  x[1], x[2], n.attr_int("top_k"), n.attr_int("capacity"), s);
  });
  add(Op::moe_router_bwd, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& x = in_t(g, n, 0).shape;
    const int64_t K = in_t(g, n, 1).shape[2];
    k::moe_router_bwd(CF(in[0]), CF(in[1]), I(in[2]), CF(in[3]), CF(in[4]), CF(in[5]), F(out[0]),
                      x[0], x[1], x[2], K, s);
  });
  add(Op::moe_dispatch, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape &x = in_t(g, n, 0).shape, &e = out_t(g, n, 0).shape;
    const int64_t K = in_t(g, n, 1).shape[2];
    const float* gates = n.inputs.size() == 4 ? CF(in[3]) : nullptr;
    if (f32_in(g, n, 0))
      k::moe_dispatch<float>(CF(in[0]), I(in[1]), I(in[2]), gates, F(out[0]), x[0], x[1], x[2],
                             e[0], K, e[2], s);
    else
      k::moe_dispatch<bf16>(BF(in[0]), I(in[1]), I(in[2]), gates, BO(out[0]), x[0], x[1], x[2],
                            e[0], K, e[2], s);
  });
  add(Op::moe_combine, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape &e = in_t(g, n, 0).shape, &r = in_t(g, n, 1).shape;
    const float* gates = n.inputs.size() == 4 ? CF(in[3]) : nullptr;
    if (f32_in(g, n, 0))
      k::moe_combine<float>(CF(in[0]), I(in[1]), I(in[2]), gates, F(out[0]), r[0], r[1], e[3], e[0],
                            r[2], e[2], s);
    else
      k::moe_combine<bf16>(BF(in[0]), I(in[1]), I(in[2]), gates, F(out[0]), r[0], r[1], e[3], e[0],
                           r[2], e[2], s);
  });
  add(Op::moe_gate_grad, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape &e = in_t(g, n, 0).shape, &r = in_t(g, n, 2).shape;
    const bool xf = f32_in(g, n, 0), yf = f32_in(g, n, 1);
    auto run = [&](auto* ye, auto* y) {
      k::moe_gate_grad(ye, y, I(in[2]), I(in[3]), F(out[0]), r[0], r[1], e[3], e[0], r[2], e[2], s);
    };
    if (xf && yf) run(CF(in[0]), CF(in[1]));
    if (xf && !yf) run(CF(in[0]), BF(in[1]));
    if (!xf && yf) run(BF(in[0]), CF(in[1]));
    if (!xf && !yf) run(BF(in[0]), BF(in[1]));
  });
  add(Op::reshape, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    if (in[0] != out[0])
      k::copy(out[0], in[0], out_n(g, n, 0) * int64_t(dtype_size(out_t(g, n, 0).dtype)), s);
  });
  // the executor has waited for the collective before this runs (executor.cc)
  add(Op::wait, [](auto&, auto&, auto, auto, k::Stream) {});
  add(Op::transpose, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const Shape& x = in_t(g, n, 0).shape;
    std::vector<int> perm;
    for (int64_t p : n.attr_ints("perm")) perm.push_back(int(p));
    k::transpose(in[0], out[0], x.data(), perm.data(), int(x.size()),
                 int(dtype_size(in_t(g, n, 0).dtype)), s);
  });
  add(Op::split, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const ops::AxisView v = ops::axis_view(n, in_t(g, n, 0).shape);
    std::vector<int64_t> sizes = n.attr_ints("sizes");
    for (int64_t& z : sizes) z *= v.inner;
    k::split_last(in[0], out, sizes.data(), int(sizes.size()), v.rows,
                  int(dtype_size(in_t(g, n, 0).dtype)), s);
  });
  add(Op::concat, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    const ops::AxisView v = ops::axis_view(n, out_t(g, n, 0).shape);
    std::vector<int64_t> sizes;
    std::vector<const void*> xs;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      sizes.push_back(in_t(g, n, int(i)).shape[size_t(v.axis)] * v.inner);
      xs.push_back(in[i]);
    }
    k::concat_last(xs.data(), out[0], sizes.data(), int(sizes.size()), v.rows,
                   int(dtype_size(out_t(g, n, 0).dtype)), s);
  });
  add(Op::adamw, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    LOOM_CHECK(out[0] == in[0] && out[1] == in[2] && out[2] == in[3]) << "adamw must run in place";
    k::adamw(F(in[0]), CF(in[1]), F(in[2]), F(in[3]), CF(in[4]), CF(in[5]), in_n(g, n, 0),
             float(n.attr_float("beta1")), float(n.attr_float("beta2")), float(n.attr_float("eps")),
             float(n.attr_float("wd")), s);
  });
  add(Op::clip_coef, [](auto& g, auto& n, auto in, auto out, k::Stream s) {
    k::clip_coef(CF(in[0]), F(out[0]), F(out[1]), float(n.attr_float("max_norm")), s);
  });
  return t;
}

}  // namespace

bool cuda_sync_each() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_CUDA_SYNC");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

KernelTable cuda_kernels(void* stream) { return make_table(static_cast<k::Stream>(stream)); }

}  // namespace loom::runtime
