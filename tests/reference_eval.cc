#include "reference_eval.h"

#include <cmath>

#include "loom/core/error.h"
#include "loom/kernels/cpu/attention_ref.h"
#include "loom/kernels/cpu/reference.h"
#include "loom/ops/linear.h"
#include "loom/ops/op.h"

namespace loom::testing {

namespace ref = loom::kernels::cpu::ref;

std::vector<std::vector<double>> eval_f64(const ir::Graph& g,
                                          const std::map<int, std::vector<double>>& inputs,
                                          int last_node) {
  std::vector<std::vector<double>> v(g.values().size());
  for (auto& [id, data] : inputs) v[id] = data;
  auto ids = [&](int id) {
    std::vector<int32_t> r;
    for (double d : v[id]) r.push_back(int32_t(d));
    return r;
  };
  for (const ir::Node& n : g.nodes()) {
    if (last_node >= 0 && n.id > last_node) break;
    for (int o : n.outputs) v[o].assign(size_t(numel(g.value(o).type.shape)), 0.0);
    auto in = [&](int i) -> std::vector<double>& { return v[n.inputs[i]]; };
    auto out = [&](int i) -> std::vector<double>& { return v[n.outputs[i]]; };
    auto shape = [&](int i) -> const Shape& { return g.value(n.inputs[i]).type.shape; };
    const ir::Op op = n.op;
    int64_t e = out(0).size();
    if (op == ir::Op::add) {
      if (shape(0) == shape(1))
        ref::add(in(0).data(), in(1).data(), out(0).data(), e);
      else
        ref::add_bias(in(0).data(), in(1).data(), out(0).data(), e / shape(1)[0], shape(1)[0]);
    } else if (op == ir::Op::mul)
      ref::mul(in(0).data(), in(1).data(), out(0).data(), e);
    else if (op == ir::Op::scale)
      ref::scale(in(0).data(), n.attr_float("s"), out(0).data(), e);
    else if (op == ir::Op::mul_scalar)
      ref::mul_scalar(in(0).data(), in(1).data(), out(0).data(), e);
    else if (op == ir::Op::gelu)
      ref::gelu_fwd(in(0).data(), out(0).data(), e);
    else if (op == ir::Op::swiglu)
      ref::swiglu_fwd(in(0).data(), in(1).data(), out(0).data(), e);
    else if (op == ir::Op::cast || op == ir::Op::reshape)
      out(0) = in(0);
    else if (op == ir::Op::sum)
      ref::sum(in(0).data(), out(0).data(), int64_t(in(0).size()));
    else if (op == ir::Op::sumsq)
      ref::sumsq(in(0).data(), out(0).data(), int64_t(in(0).size()));
    else if (op == ir::Op::sum_rows)
      ref::sum_rows(in(0).data(), out(0).data(), int64_t(in(0).size()) / e, e);
    else if (op == ir::Op::broadcast_scalar)
      std::fill(out(0).begin(), out(0).end(), in(0)[0]);
    else if (op == ir::Op::broadcast_rows) {
      for (size_t i = 0; i < out(0).size(); ++i) out(0)[i] = in(0)[i % in(0).size()];
    } else if (op == ir::Op::grouped_matmul) {
      // the batched matmul it equals: per expert, rows (B*S) of a
      const Shape &a = shape(0), &w = shape(1);
      const bool ta = n.attr_int("ta", 0), tb = n.attr_int("tb", 0);
      const int64_t E = a[0], R = a[1] * a[2];
      const auto &A = in(0), &W = in(1);
      auto& Y = out(0);
      if (!ta) {
        const int64_t K = a[3], N = tb ? w[1] : w[2];
        for (int64_t e = 0; e < E; ++e)
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (int64_t k = 0; k < K; ++k)
                s +=
                    A[(e * R + r) * K + k] * (tb ? W[(e * N + j) * K + k] : W[(e * K + k) * N + j]);
              Y[(e * R + r) * N + j] = s;
            }
      } else {
        const int64_t M = a[3], N = w[3];
        for (int64_t e = 0; e < E; ++e)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (int64_t r = 0; r < R; ++r) s += A[(e * R + r) * M + i] * W[(e * R + r) * N + j];
              Y[(e * M + i) * N + j] = s;
            }
      }
    } else if (op == ir::Op::moe_router) {
      const Shape& s = shape(0);
      const int64_t K = n.attr_int("top_k"), N = s[0] * s[1] * K;
      std::vector<int32_t> ex(static_cast<size_t>(N)), sl(static_cast<size_t>(N));
      ref::moe_router(in(0).data(), out(0).data(), ex.data(), sl.data(), out(3).data(),
                      out(4).data(), out(5).data(), out(6).data(), s[0], s[1], s[2], K,
                      n.attr_int("capacity"));
      out(1).assign(ex.begin(), ex.end());
      out(2).assign(sl.begin(), sl.end());
    } else if (op == ir::Op::moe_dispatch || op == ir::Op::moe_combine) {
      const bool dispatch = op == ir::Op::moe_dispatch;
      const Shape& ex = g.value(n.outputs[0]).type.shape;  // (E,B,S,C) or (B,T,C)
      const Shape& e = dispatch ? ex : shape(0);
      const Shape& r = shape(1);
      auto experts = ids(n.inputs[1]), slots = ids(n.inputs[2]);
      const double* gates = n.inputs.size() == 4 ? in(3).data() : nullptr;
      if (dispatch)
        ref::moe_dispatch(in(0).data(), experts.data(), slots.data(), gates, out(0).data(), r[0],
                          r[1], e[3], e[0], r[2], e[2]);
      else
        ref::moe_combine(in(0).data(), experts.data(), slots.data(), gates, out(0).data(), r[0],
                         r[1], e[3], e[0], r[2], e[2]);
    } else if (op == ir::Op::embedding) {
      auto id = ids(n.inputs[0]);
      ref::embedding_fwd(id.data(), in(1).data(), out(0).data(), int64_t(id.size()), shape(1)[1]);
    } else if (op == ir::Op::matmul) {
      ops::MatmulDims d = ops::matmul_dims(g, n);
      const auto &A = in(0), &B = in(1);
      auto& Cm = out(0);
      for (int64_t b = 0; b < d.batch; ++b)
        for (int64_t i = 0; i < d.M; ++i)
          for (int64_t j = 0; j < d.N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < d.K; ++k) {
              double a = d.ta ? A[b * d.M * d.K + k * d.M + i] : A[b * d.M * d.K + i * d.K + k];
              double bb = d.tb ? B[b * d.N * d.K + j * d.K + k] : B[b * d.N * d.K + k * d.N + j];
              s += a * bb;
            }
            Cm[b * d.M * d.N + i * d.N + j] = s;
          }
    } else if (op == ir::Op::rmsnorm) {
      int64_t C = shape(1)[0];
      ref::rmsnorm_fwd(in(0).data(), in(1).data(), out(0).data(), out(1).data(), e / C, C,
                       n.attr_float("eps"));
    } else if (op == ir::Op::layernorm) {
      int64_t C = shape(1)[0];
      ref::layernorm_fwd(in(0).data(), in(1).data(), in(2).data(), out(0).data(), out(1).data(),
                         out(2).data(), e / C, C, n.attr_float("eps"));
    } else if (op == ir::Op::rope) {
      const Shape& s = shape(0);
      ref::rope(in(0).data(), out(0).data(), s[0], s[1], s[2], s[3], n.attr_float("theta"),
                int(n.attr_int("sign", 1)));
    } else if (op == ir::Op::attention) {
      const Shape &q = shape(0), &k = shape(1);
      ref::attention_fwd(in(0).data(), in(1).data(), in(2).data(), out(0).data(), out(1).data(),
                         q[0], q[1], q[2], k[2], q[3], n.attr_float("scale"));
    } else if (op == ir::Op::cross_entropy) {
      auto t = ids(n.inputs[1]);
      int64_t V = shape(0).back();
      ref::cross_entropy(in(0).data(), t.data(), out(0).data(), out(1).data(), int64_t(t.size()),
                         V);
    } else if (op == ir::Op::transpose) {
      std::vector<int> perm;
      for (int64_t p : n.attr_ints("perm")) perm.push_back(int(p));
      ref::transpose(in(0).data(), out(0).data(), shape(0).data(), perm.data(), int(perm.size()),
                     8);
    } else if (op == ir::Op::split) {  // along the last dim of the (rows, dim * inner) view
      const ops::AxisView v = ops::axis_view(n, shape(0));
      std::vector<int64_t> sizes = n.attr_ints("sizes");
      for (int64_t& s : sizes) s *= v.inner;
      std::vector<double*> ys;
      for (size_t i = 0; i < sizes.size(); ++i) ys.push_back(out(int(i)).data());
      ref::split_last(in(0).data(), ys.data(), sizes.data(), int(sizes.size()), v.rows);
    } else if (op == ir::Op::concat) {
      const ops::AxisView v = ops::axis_view(n, g.value(n.outputs[0]).type.shape);
      std::vector<int64_t> sizes;
      std::vector<const double*> xs;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        sizes.push_back(shape(int(i))[size_t(v.axis)] * v.inner);
        xs.push_back(in(int(i)).data());
      }
      ref::concat_last(xs.data(), out(0).data(), sizes.data(), int(sizes.size()), v.rows);
    } else if (op == ir::Op::positions) {
      int64_t T = g.value(n.outputs[0]).type.shape.back();
      for (int64_t i = 0; i < e; ++i) out(0)[i] = double(i % T);
    } else if (op == ir::Op::fill) {
      std::fill(out(0).begin(), out(0).end(), n.attr_float("value", 0.0));
    } else {
      throw Error("reference_eval: no reference for op " + std::string(ir::op_name(op)));
    }
  }
  return v;
}

}  // namespace loom::testing
