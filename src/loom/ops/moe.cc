// Mixture-of-Experts: routing tokens to experts, moving them into per-expert buffers and back.
//
// moe_router(logits f32 (B,T,E)) {top_k K, capacity S}
//   -> gates f32 (B,T,K), experts i32 (B,T,K), slots i32 (B,T,K),
//      prob_sum f32 (E), z_sum f32 [], routed f32 (E), kept f32 (E)
//   Per token: p = softmax(logits) over the E experts; the K largest (ties: the lower index)
//   are its experts, in decreasing order; gates = their p renormalised to sum to one (Mixtral),
//   which is the softmax over the chosen logits alone. Each sequence b has `capacity` slots per
//   expert, given out choice-major (every token's first choice in token order, then every
//   second choice, as GShard and Switch do); a choice that finds its expert full is dropped:
//   slot -1. prob_sum[e] = sum over tokens of p[e]; z_sum = sum over tokens of logsumexp(logits)^2
//   (the router z-loss's numerator); routed[e] = choices of e before drops, kept[e] after. The
//   sums over tokens are what the auxiliary losses and the load metrics are built from; routed
//   and kept are counts, constant almost everywhere, so they carry no gradient.
// moe_router_bwd(logits, gates, experts, dgates, dprob_sum, dz_sum) -> dlogits
//
// moe_dispatch(x (B,T,C), experts, slots [, gates]) {num_experts E, capacity S} -> xe (E,B,S,C)
//   xe[e,b,s] = (gate *) x[b,t] for each kept choice (b,t,k) with experts = e and slots = s;
//   zeros in the slots nobody took. x and xe share a dtype (f32 or bf16).
// moe_combine(ye (E,B,S,C), experts, slots [, gates]) -> y f32 (B,T,C)
//   y[b,t] = sum over the token's kept choices of (gate *) ye[e,b,s]; dropped choices add nothing.
// moe_gate_grad(ye (E,B,S,C), y (B,T,C), experts, slots) -> f32 (B,T,K)
//   the dot product of ye[e,b,s] and y[b,t] per kept choice, 0 for a dropped one: the gradient of
//   the gates of a dispatch or a combine.
// Dispatch and combine are each other's VJP (with the same gates).
//
// grouped_matmul(a, b) {ta, tb, out, fill}: the experts' GEMMs over their slots, a batched matmul
// per expert e whose rows are the (B,S) slots:
//   ta = 0: a (E,B,S,K), b (E,N,K) (tb) or (E,K,N) -> (E,B,S,N) = a[e] op(b[e])
//   ta = 1: a (E,B,S,M), b (E,B,S,N), tb = 0 -> (E,M,N) = a[e]^T b[e], summed over the slots
// Inputs both f32 or both bf16; `out` as matmul's. Its value is exactly the batched matmul's; the
// kernel skips each sequence's empty slots (rows of `a` that are zero contribute zero: an empty
// slot's input is zero, and stays zero through SwiGLU, GELU and RMSNorm), so a capacity factor, or
// dropless routing, costs memory but no FLOPs. `fill` (optional, in [0,1]) is the fraction of slots
// the model expects filled (balanced routing: T k / (E S)); the cost, and so the simulator, counts
// only those. Worked VJP (ta = 0, tb = 1): y = a b^T,
// da = dy b (ta = 0, tb = 0), db = dy^T a (ta = 1); with tb = 0, da = dy b^T, db = a^T dy.
//
// Sharding: sequences (b) split freely; a sequence's tokens, its experts' slots and the expert
// dim are whole in these ops (capacity is per sequence, so a rank holding some sequences routes
// them exactly as one process would). The expert dim of xe/ye splits only after a reshard (the
// `expert` tactic's all-to-all).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/linear.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using ir::Attrs;
using ir::TensorType;
using Types = std::vector<TensorType>;

int64_t int_attr(std::string_view op, const Types& in, const Attrs& a, const char* key) {
  auto it = a.find(key);
  if (it == a.end() || !std::holds_alternative<int64_t>(it->second))
    type_error(op, in, fmt::format("needs an integer attribute {}", key));
  return std::get<int64_t>(it->second);
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

// The (B,T,K) routing inputs of dispatch, combine and gate_grad, at positions i, i+1 (and i+2 for
// gates when present), checked against the token tensor's (B,T).
int64_t check_routing(std::string_view op, const Types& in, size_t i, int64_t B, int64_t T,
                      bool gates) {
  const Shape& s = in[i].shape;
  if (s.size() != 3 || s[0] != B || s[1] != T || in[i].dtype != DType::i32 || in[i + 1] != in[i])
    type_error(op, in, "experts and slots must be i32 (B,T,K) of the tokens' (B,T)");
  if (gates && (in[i + 2].shape != s || in[i + 2].dtype != DType::f32))
    type_error(op, in, "gates must be f32 (B,T,K)");
  return s[2];
}

Cost moving_cost(const ir::Graph& g, const ir::Node& n, double flops_per_elem) {
  Cost c = streaming_cost(g, n, 0);
  // the expert-layout tensor is the larger side; every element of it is touched once
  int v = g.value(n.inputs[0]).type.shape.size() == 4 ? n.inputs[0] : n.outputs[0];
  c.flops = flops_per_elem * double(numel(g.value(v).type.shape));
  return c;
}

struct GroupedDims {
  int64_t E = 0, rows = 0, M = 0, N = 0, K = 0;  // per expert: (M,K) x (K,N); rows = B*S
};

GroupedDims grouped_dims(const Types& in, const Attrs& a) {
  expect_inputs("grouped_matmul", in, 2);
  auto flag = [&](const char* k) {
    auto it = a.find(k);
    return it != a.end() && std::holds_alternative<int64_t>(it->second) &&
           std::get<int64_t>(it->second) != 0;
  };
  const bool ta = flag("ta"), tb = flag("tb");
  const Shape &x = in[0].shape, &w = in[1].shape;
  if (in[0].dtype != in[1].dtype || !is_float(in[0].dtype))
    type_error("grouped_matmul", in, "inputs must both be f32 or both bf16");
  if (x.size() != 4) type_error("grouped_matmul", in, "a must be (E,B,S,K)");
  GroupedDims d;
  d.E = x[0];
  d.rows = x[1] * x[2];
  if (!ta) {
    if (w.size() != 3 || w[0] != d.E)
      type_error("grouped_matmul", in, "b must be (E,N,K) (tb) or (E,K,N)");
    d.M = d.rows;
    d.K = x[3];
    d.N = tb ? w[1] : w[2];
    if ((tb ? w[2] : w[1]) != d.K) type_error("grouped_matmul", in, "contraction dims differ");
  } else {
    if (tb || w.size() != 4 || Shape(w.begin(), w.end() - 1) != Shape(x.begin(), x.end() - 1))
      type_error("grouped_matmul", in, "ta = 1 needs a (E,B,S,M), b (E,B,S,N) and tb = 0");
    d.M = x[3];
    d.N = w[3];
    d.K = d.rows;
  }
  return d;
}

DType grouped_out(const Types& in, const Attrs& a) {
  auto it = a.find("out");
  if (it == a.end()) return DType::f32;
  DType t;
  if (!std::holds_alternative<std::string>(it->second) ||
      !parse_dtype(std::get<std::string>(it->second), &t) || t == DType::i32 ||
      (t == DType::bf16 && in[0].dtype != DType::bf16))
    type_error("grouped_matmul", in, "out must be \"f32\", or \"bf16\" with bf16 inputs");
  return t;
}

}  // namespace

MatmulDims grouped_matmul_dims(const ir::Graph& g, const ir::Node& n) {
  GroupedDims d = grouped_dims({g.value(n.inputs[0]).type, g.value(n.inputs[1]).type}, n.attrs);
  MatmulDims m;
  m.batch = d.E;
  m.M = d.M;
  m.N = d.N;
  m.K = d.K;
  m.ta = n.attr_int("ta", 0);
  m.tb = n.attr_int("tb", 0);
  // the slot rows expected filled: the rows (ta = 0) or the contraction (ta = 1)
  const double fill = std::clamp(n.attr_float("fill", 1.0), 0.0, 1.0);
  int64_t& rows = m.ta ? m.K : m.M;
  rows = std::max<int64_t>(1, int64_t(std::llround(double(rows) * fill)));
  return m;
}

void register_moe_ops() {
  register_op(
      {.name = "moe_router",
       .num_inputs = 1,
       .infer =
           [](const Types& in, const Attrs& a) {
             expect_inputs("moe_router", in, 1);
             const Shape& s = in[0].shape;
             if (in[0].dtype != DType::f32 || s.size() != 3 || s[2] < 1)
               type_error("moe_router", in, "expects logits f32 (B,T,E)");
             const int64_t K = int_attr("moe_router", in, a, "top_k");
             const int64_t S = int_attr("moe_router", in, a, "capacity");
             if (K < 1 || K > s[2]) type_error("moe_router", in, "needs 1 <= top_k <= E");
             if (S < 1) type_error("moe_router", in, "needs capacity >= 1");
             const Shape bt{s[0], s[1], K};
             const TensorType e{DType::f32, {s[2]}};
             return Types{
                 {DType::f32, bt}, {DType::i32, bt}, {DType::i32, bt}, e, {DType::f32, {}}, e, e};
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             // routed and kept are counts (zero derivative almost everywhere): their gradients,
             // if any, are dropped; a missing one of the others is zero
             auto or_zero = [&](int i) {
               if (d[size_t(i)] >= 0) return d[size_t(i)];
               return b.emit1(Op::fill, {},
                              {{"shape", b.shape(n.outputs[size_t(i)])}, {"value", 0.0}},
                              "grad.zeros");
             };
             int dl = b.emit1(
                 Op::moe_router_bwd,
                 {n.inputs[0], n.outputs[0], n.outputs[1], or_zero(0), or_zero(3), or_zero(4)}, {},
                 "grad.router_logits");
             return std::vector<int>{dl};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 8); },
       .sharding = einsum("bTE->bTK,bTK,bTK,E,,E,E")});
  register_op(
      {.name = "moe_router_bwd",
       .num_inputs = 6,
       .infer =
           [](const Types& in, const Attrs&) {
             expect_inputs("moe_router_bwd", in, 6);
             const Shape& s = in[0].shape;
             if (in[0].dtype != DType::f32 || s.size() != 3)
               type_error("moe_router_bwd", in, "expects logits f32 (B,T,E)");
             check_routing("moe_router_bwd", {in[2], in[2], in[1]}, 0, s[0], s[1], true);
             if (in[3] != in[1] || in[4] != TensorType{DType::f32, {s[2]}} ||
                 in[5] != TensorType{DType::f32, {}})
               type_error("moe_router_bwd", in, "dgates (B,T,K), dprob_sum (E), dz_sum []");
             return Types{in[0]};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 10); },
       .sharding = einsum("bTE,bTK,bTK,bTK,E,->bTE")});

  // dispatch and combine: one rule per arity (the gates are optional)
  auto routing_rule = [](std::string three, std::string four) {
    return ShardingRule{.rule = [three, four](const Types& in, const Types& out, const Attrs&) {
      return einsum_rule(in.size() == 4 ? four : three, in, out);
    }};
  };
  register_op({.name = "moe_dispatch",
               .num_inputs = -1,
               .infer =
                   [](const Types& in, const Attrs& a) {
                     if (in.size() != 3 && in.size() != 4)
                       type_error("moe_dispatch", in, "expects x, experts, slots [, gates]");
                     const Shape& s = in[0].shape;
                     if (!is_float(in[0].dtype) || s.size() != 3)
                       type_error("moe_dispatch", in, "x must be f32 or bf16 (B,T,C)");
                     check_routing("moe_dispatch", in, 1, s[0], s[1], in.size() == 4);
                     const int64_t E = int_attr("moe_dispatch", in, a, "num_experts");
                     const int64_t S = int_attr("moe_dispatch", in, a, "capacity");
                     if (E < 1 || S < 1)
                       type_error("moe_dispatch", in, "needs num_experts >= 1 and capacity >= 1");
                     return Types{{in[0].dtype, {E, s[0], S, s[2]}}};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     std::vector<int> routing(n.inputs.begin() + 1, n.inputs.end());
                     std::vector<int> in{d[0]};
                     in.insert(in.end(), routing.begin(), routing.end());
                     int dx = b.emit1(Op::moe_combine, in, {}, "grad.dispatch_x");
                     dx = b.cast(dx, b.type(n.inputs[0]).dtype);
                     std::vector<int> r{dx, -1, -1};
                     if (n.inputs.size() == 4)
                       r.push_back(b.emit1(Op::moe_gate_grad,
                                           {d[0], n.inputs[0], n.inputs[1], n.inputs[2]}, {},
                                           "grad.dispatch_gates"));
                     return r;
                   },
               .cost = [](const ir::Graph& g, const ir::Node& n) { return moving_cost(g, n, 0); },
               .sharding = routing_rule("bTC,bTK,bTK->EbSC", "bTC,bTK,bTK,bTK->EbSC")});
  register_op(
      {.name = "moe_combine",
       .num_inputs = -1,
       .infer =
           [](const Types& in, const Attrs&) {
             if (in.size() != 3 && in.size() != 4)
               type_error("moe_combine", in, "expects ye, experts, slots [, gates]");
             const Shape& s = in[0].shape;
             if (!is_float(in[0].dtype) || s.size() != 4)
               type_error("moe_combine", in, "ye must be f32 or bf16 (E,B,S,C)");
             if (in[1].shape.size() != 3)
               type_error("moe_combine", in, "experts and slots must be i32 (B,T,K)");
             check_routing("moe_combine", in, 1, s[1], in[1].shape[1], in.size() == 4);
             return Types{{DType::f32, {s[1], in[1].shape[1], s[3]}}};
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             const Shape& s = b.shape(n.inputs[0]);
             std::vector<int> in{d[0]};
             in.insert(in.end(), n.inputs.begin() + 1, n.inputs.end());
             int dye = b.emit1(Op::moe_dispatch, in, {{"num_experts", s[0]}, {"capacity", s[2]}},
                               "grad.combine_ye");
             dye = b.cast(dye, b.type(n.inputs[0]).dtype);
             std::vector<int> r{dye, -1, -1};
             if (n.inputs.size() == 4)
               r.push_back(b.emit1(Op::moe_gate_grad, {n.inputs[0], d[0], n.inputs[1], n.inputs[2]},
                                   {}, "grad.combine_gates"));
             return r;
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return moving_cost(g, n, 2); },
       .sharding = routing_rule("EbSC,bTK,bTK->bTC", "EbSC,bTK,bTK,bTK->bTC")});
  register_op({.name = "grouped_matmul",
               .num_inputs = 2,
               .infer =
                   [](const Types& in, const Attrs& a) {
                     GroupedDims d = grouped_dims(in, a);
                     const DType t = grouped_out(in, a);
                     if (in[1].shape.size() == 4) return Types{{t, {d.E, d.M, d.N}}};
                     Shape s = in[0].shape;
                     s.back() = d.N;
                     return Types{{t, s}};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     if (n.attr_int("ta", 0))
                       throw Error("grouped_matmul: ta = 1 is not differentiable");
                     const int A = n.inputs[0], W = n.inputs[1];
                     const bool tb = n.attr_int("tb", 0);
                     // an operand cast from f32 (the weights) takes its gradient in f32 (as matmul)
                     auto grad_dtype = [&](int v) {
                       const ir::Value& val = b.graph().value(v);
                       if (val.type.dtype == DType::bf16 && val.kind == ir::ValueKind::node) {
                         const ir::Node& p = b.graph().node(val.producer);
                         if (p.op == Op::cast && b.type(p.inputs[0]).dtype == DType::f32)
                           return DType::f32;
                       }
                       return val.type.dtype;
                     };
                     auto gm = [&](int x, int y, bool ta, bool tb2, DType out,
                                   const std::string& name) {
                       ir::Attrs at{{"ta", int64_t(ta)}, {"tb", int64_t(tb2)}};
                       if (out != DType::f32) at["out"] = std::string(dtype_name(out));
                       if (n.attrs.count("fill")) at["fill"] = n.attr_float("fill");
                       return b.emit1(Op::grouped_matmul, {x, y}, std::move(at), name);
                     };
                     const int dy = b.cast(d[0], b.type(A).dtype);
                     const int da = gm(dy, W, false, !tb, grad_dtype(A), "grad.grouped_a");
                     const int dw = tb ? gm(dy, A, true, false, grad_dtype(W), "grad.grouped_b")
                                       : gm(A, dy, true, false, grad_dtype(W), "grad.grouped_b");
                     return std::vector<int>{da, dw};
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     // the slots expected filled (attribute fill; 1: every slot): the kernel skips
                     // the empty ones, how many is known only when the step runs
                     const MatmulDims d = grouped_matmul_dims(g, n);
                     Cost c = streaming_cost(g, n, 0);
                     c.flops = 2.0 * double(d.batch) * double(d.M) * double(d.N) * double(d.K);
                     return c;
                   },
               .sharding = {.rule = [](const Types& in, const Types& out, const Attrs& a) {
                 if (in[1].shape.size() == 4) return einsum_rule("ebsm,ebsn->emn", in, out);
                 auto it = a.find("tb");
                 const bool tb = it != a.end() && std::get<int64_t>(it->second) != 0;
                 return einsum_rule(tb ? "ebsk,enk->ebsn" : "ebsk,ekn->ebsn", in, out);
               }}});
  register_op({.name = "moe_gate_grad",
               .num_inputs = 4,
               .infer =
                   [](const Types& in, const Attrs&) {
                     expect_inputs("moe_gate_grad", in, 4);
                     const Shape &e = in[0].shape, &t = in[1].shape;
                     if (!is_float(in[0].dtype) || !is_float(in[1].dtype) || e.size() != 4 ||
                         t.size() != 3 || t[0] != e[1] || t[2] != e[3])
                       type_error("moe_gate_grad", in, "expects ye (E,B,S,C) and y (B,T,C)");
                     int64_t K = check_routing("moe_gate_grad", in, 2, t[0], t[1], false);
                     return Types{{DType::f32, {t[0], t[1], K}}};
                   },
               .cost = [](const ir::Graph& g, const ir::Node& n) { return moving_cost(g, n, 2); },
               .sharding = einsum("EbSC,bTC,bTK,bTK->bTK")});
}

}  // namespace loom::ops
