// The op harness's cases, shared by op_grad_test (forward against the f64 reference interpreter,
// VJPs against central differences) and op_coverage_test (every registered op has a case, a kernel
// and a reference, or a reasoned exemption): for every differentiable op, one small graph with
// awkward shapes, and the harness graph built around it (loss = sum_i sum(out_i * R_i), then
// autodiff).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "loom/autodiff/autodiff.h"
#include "loom/ops/builder.h"

namespace loom {

using ir::TensorType;
using ir::ValueKind;

struct OpCase {
  std::string name;
  std::function<std::vector<int>(ir::Graph&, ops::Builder&)> build;
  double rtol = 2e-3, atol = 2e-4;
  int id_range = 0;       // i32 inputs are drawn from [0, id_range)
  double fwd_tol = 1e-5;  // forward: max |out - ref| / max |ref|
};

inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// A case's graph: its outputs, the loss over them, and autodiff's gradients; nodes up to
// forward_end are the forward (what the reference interpreter evaluates), the rest the backward.
struct Harness {
  ir::Graph g;
  std::vector<int> outs, params, rs;
  int loss = -1, forward_end = -1;
  std::map<int, int> grads;
};

inline Harness build_harness(const OpCase& c) {
  Harness h{ir::Graph("op_" + c.name)};
  ir::Graph& g = h.g;
  ops::Builder b(g);
  h.outs = c.build(g, b);
  for (size_t i = 0; i < h.outs.size(); ++i) {
    int o = b.cast(h.outs[i], DType::f32);
    int r = g.add_input(fmt::format("r{}", i), {DType::f32, b.shape(o)}, ValueKind::state);
    h.rs.push_back(r);
    int s = b.emit1(ir::Op::sum, {b.mul(o, r)});
    h.loss = h.loss < 0 ? s : b.add(h.loss, s);
  }
  h.params = g.inputs_of_kind(ValueKind::param);
  h.forward_end = g.value(h.loss).producer;
  h.grads = autodiff::gradients(b, h.loss, h.params);
  g.add_output(h.loss);
  for (int o : h.outs) g.add_output(o);
  for (auto [p, d] : h.grads) g.add_output(d);
  return h;
}

inline int P(ir::Graph& g, const std::string& name, Shape s) {
  return g.add_input(name, {DType::f32, s}, ValueKind::param);
}
inline int Ids(ir::Graph& g, const std::string& name, Shape s) {
  return g.add_input(name, {DType::i32, s}, ValueKind::input);
}

inline std::vector<OpCase> cases() {
  std::vector<OpCase> v;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      v.push_back({"matmul_ta" + std::to_string(ta) + "_tb" + std::to_string(tb),
                   [ta, tb](ir::Graph& g, ops::Builder& b) {
                     // 3-D a: (2,3,5) viewed as rows; contraction dim 5 (or 6 when ta)
                     int a = ta ? P(g, "a", {2, 3, 5}) : P(g, "a", {2, 3, 5});
                     int bb = ta ? (tb ? P(g, "b", {4, 6}) : P(g, "b", {6, 4}))
                                 : (tb ? P(g, "b", {4, 5}) : P(g, "b", {5, 4}));
                     return std::vector<int>{b.matmul(a, bb, ta, tb)};
                   }});
    }
  v.push_back({"matmul_batched", [](ir::Graph& g, ops::Builder& b) {
                 int a = P(g, "a", {3, 4, 5}), bb = P(g, "b", {3, 6, 5});
                 return std::vector<int>{
                     b.emit1(ir::Op::matmul, {a, bb}, {{"tb", int64_t(1)}, {"batch", int64_t(1)}})};
               }});
  v.push_back({"add", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.add(P(g, "a", {3, 7}), P(g, "b", {3, 7}))};
               }});
  v.push_back({"add_bias", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.add(P(g, "a", {2, 3, 7}), P(g, "b", {7}))};
               }});
  v.push_back({"mul", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.mul(P(g, "a", {5, 3}), P(g, "b", {5, 3}))};
               }});
  v.push_back({"scale", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.scale(P(g, "a", {9}), -0.75)};
               }});
  v.push_back(
      {"mul_scalar", [](ir::Graph& g, ops::Builder& b) {
         return std::vector<int>{b.emit1(ir::Op::mul_scalar, {P(g, "a", {4, 5}), P(g, "s", {})})};
       }});
  v.push_back({"gelu", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::gelu, {P(g, "x", {3, 17})})};
               }});
  v.push_back(
      {"swiglu", [](ir::Graph& g, ops::Builder& b) {
         return std::vector<int>{b.emit1(ir::Op::swiglu, {P(g, "g", {3, 17}), P(g, "u", {3, 17})})};
       }});
  v.push_back({"swiglu_bf16",
               [](ir::Graph& g, ops::Builder& b) {
                 int gg = b.cast(P(g, "g", {3, 17}), DType::bf16);
                 int u = b.cast(P(g, "u", {3, 17}), DType::bf16);
                 return std::vector<int>{b.emit1(ir::Op::swiglu, {gg, u})};
               },
               3e-2, 3e-2, 0, 1e-2});  // bf16 storage of inputs, output and gradients
  v.push_back(
      {"cast_roundtrip",
       [](ir::Graph& g, ops::Builder& b) {
         return std::vector<int>{b.cast(b.cast(P(g, "x", {4, 9}), DType::bf16), DType::f32)};
       },
       1e-2, 1e-2, 0, 4e-3});  // bf16 rounding: 2^-9 relative
  v.push_back({"sum", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::sum, {P(g, "x", {4, 9})})};
               }});
  v.push_back({"sumsq", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::sumsq, {P(g, "x", {4, 9})})};
               }});
  v.push_back({"sum_rows", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::sum_rows, {P(g, "x", {2, 4, 9})})};
               }});
  v.push_back({"broadcast_scalar", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{
                     b.emit1(ir::Op::broadcast_scalar, {P(g, "s", {})}, {{"shape", Shape{3, 4}}})};
               }});
  v.push_back({"broadcast_rows", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::broadcast_rows, {P(g, "v", {5})},
                                                 {{"shape", Shape{2, 3, 5}}})};
               }});
  v.push_back({"embedding",
               [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{
                     b.emit1(ir::Op::embedding, {Ids(g, "ids", {2, 9}), P(g, "table", {7, 5})})};
               },
               2e-3, 2e-4, 7});
  // Mixture-of-Experts: 2 sequences of 5 tokens, 4 experts, top 2, 3 slots per expert and
  // sequence (some choices drop). The routing comes from a router over param logits, so the
  // logits' gradient checks moe_router_bwd through the gates.
  auto routed = [](ir::Graph& g, ops::Builder& b, int64_t cap) {
    return b.emit(ir::Op::moe_router, {P(g, "logits", {2, 5, 4})},
                  {{"top_k", int64_t(2)}, {"capacity", cap}});
  };
  // the experts' GEMMs over dispatched slots (empty ones zero, skipped by the kernel), both
  // weight layouts; 3 experts, 2 sequences of 20 slots (more than the 16-row rounding)
  v.push_back({"grouped_matmul", [](ir::Graph& g, ops::Builder& b) {
                 // the logits as a state: only the slots are read, which carry no gradient
                 int logits = g.add_input("logits", {DType::f32, {2, 9, 3}}, ValueKind::state);
                 auto r = b.emit(ir::Op::moe_router, {logits},
                                 {{"top_k", int64_t(2)}, {"capacity", int64_t(20)}});
                 int xe = b.emit1(ir::Op::moe_dispatch, {P(g, "x", {2, 9, 5}), r[1], r[2]},
                                  {{"num_experts", int64_t(3)}, {"capacity", int64_t(20)}});
                 int h = b.emit1(ir::Op::grouped_matmul, {xe, P(g, "w1", {3, 4, 5})},
                                 {{"ta", int64_t(0)}, {"tb", int64_t(1)}});
                 return std::vector<int>{b.emit1(ir::Op::grouped_matmul, {h, P(g, "w2", {3, 4, 6})},
                                                 {{"ta", int64_t(0)}, {"tb", int64_t(0)}})};
               }});
  v.push_back({"moe_router", [routed](ir::Graph& g, ops::Builder& b) {
                 auto r = routed(g, b, 3);
                 return std::vector<int>{r[0], r[3], r[4]};  // gates, prob_sum, z_sum
               }});
  v.push_back({"moe_dispatch", [routed](ir::Graph& g, ops::Builder& b) {
                 auto r = routed(g, b, 3);
                 int x = P(g, "x", {2, 5, 3});
                 ir::Attrs a{{"num_experts", int64_t(4)}, {"capacity", int64_t(3)}};
                 return std::vector<int>{b.emit1(ir::Op::moe_dispatch, {x, r[1], r[2], r[0]}, a),
                                         b.emit1(ir::Op::moe_dispatch, {x, r[1], r[2]}, a)};
               }});
  v.push_back({"moe_combine", [routed](ir::Graph& g, ops::Builder& b) {
                 auto r = routed(g, b, 3);
                 int ye = P(g, "ye", {4, 2, 3, 3});
                 return std::vector<int>{b.emit1(ir::Op::moe_combine, {ye, r[1], r[2], r[0]}),
                                         b.emit1(ir::Op::moe_combine, {ye, r[1], r[2]})};
               }});
  v.push_back({"rmsnorm", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit(ir::Op::rmsnorm,
                                                {P(g, "x", {2, 3, 33}), P(g, "w", {33})},
                                                {{"eps", 1e-5}})[0]};
               }});
  v.push_back({"layernorm", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit(
                     ir::Op::layernorm, {P(g, "x", {5, 33}), P(g, "w", {33}), P(g, "b", {33})},
                     {{"eps", 1e-5}})[0]};
               }});
  v.push_back({"rope", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::rope, {P(g, "x", {2, 5, 3, 8})},
                                                 {{"theta", 10000.0}, {"sign", int64_t(1)}})};
               }});
  v.push_back(
      {"attention_gqa", [](ir::Graph& g, ops::Builder& b) {
         int q = P(g, "q", {2, 7, 4, 8}), k = P(g, "k", {2, 7, 2, 8}), vv = P(g, "v", {2, 7, 2, 8});
         return std::vector<int>{
             b.emit(ir::Op::attention, {q, k, vv}, {{"scale", 1.0 / std::sqrt(8.0)}})[0]};
       }});
  v.push_back(
      {"attention_long", [](ir::Graph& g, ops::Builder& b) {
         int q = P(g, "q", {1, 70, 2, 16}), k = P(g, "k", {1, 70, 1, 16}),
             vv = P(g, "v", {1, 70, 1, 16});
         return std::vector<int>{b.emit(ir::Op::attention, {q, k, vv}, {{"scale", 0.25}})[0]};
       }});
  v.push_back({"cross_entropy",
               [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit(
                     ir::Op::cross_entropy, {P(g, "logits", {2, 3, 11}), Ids(g, "t", {2, 3})})[0]};
               },
               2e-3, 2e-4, 11});
  v.push_back({"reshape", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.reshape(P(g, "x", {2, 6}), {3, 4})};
               }});
  v.push_back({"transpose", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1(ir::Op::transpose, {P(g, "x", {2, 3, 4, 5})},
                                                 {{"perm", std::vector<int64_t>{0, 2, 1, 3}}})};
               }});
  v.push_back({"split_concat", [](ir::Graph& g, ops::Builder& b) {
                 auto parts = b.emit(ir::Op::split, {P(g, "x", {3, 10})},
                                     {{"sizes", std::vector<int64_t>{2, 3, 5}}});
                 int c = b.emit1(ir::Op::concat, {parts[2], P(g, "y", {3, 4}), parts[0]});
                 return std::vector<int>{c, parts[1]};
               }});
  // along a middle axis (GPT-2's c_attn weight, (C, 3, C), into q, k and v) and the first
  v.push_back(
      {"split_concat_axis", [](ir::Graph& g, ops::Builder& b) {
         auto parts = b.emit(ir::Op::split, {P(g, "x", {2, 3, 4})},
                             {{"sizes", std::vector<int64_t>{1, 2}}, {"axis", int64_t(1)}});
         int c = b.emit1(ir::Op::concat, {parts[1], P(g, "y", {1, 2, 4})}, {{"axis", int64_t(0)}});
         return std::vector<int>{c, parts[0]};
       }});
  return v;
}

}  // namespace loom
