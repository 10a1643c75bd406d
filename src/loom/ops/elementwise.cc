// Elementwise ops and reductions: add (with bias broadcast), mul, scale, mul_scalar, gelu, swiglu,
// cast, sum, sumsq, sum_rows, and the broadcasts their VJPs need.
//
// Shapes: add/mul take equal shapes, except add(a (...,C), b (C)) which broadcasts b over rows.
// Everything is f32 except cast.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using ir::Attrs;
using ir::TensorType;
using Types = std::vector<TensorType>;

void expect_f32(std::string_view op, const Types& in) {
  for (const auto& t : in)
    if (t.dtype != DType::f32) type_error(op, in, "expects f32 inputs");
}

Types same_as_first(std::string_view op, const Types& in, size_t n) {
  expect_inputs(op, in, n);
  expect_f32(op, in);
  for (size_t i = 1; i < n; ++i)
    if (in[i].shape != in[0].shape) type_error(op, in, "input shapes differ");
  return {in[0]};
}

// Equal types, f32 or bf16 (ops whose kernels also store bf16).
Types same_float(std::string_view op, const Types& in, size_t n) {
  expect_inputs(op, in, n);
  for (size_t i = 0; i < n; ++i)
    if (in[i] != in[0] || in[i].dtype == DType::i32)
      type_error(op, in, "inputs must share one shape and a float dtype");
  return {in[0]};
}

Shape attr_shape(const Attrs& a, std::string_view op) {
  auto it = a.find("shape");
  if (it == a.end() || !std::holds_alternative<std::vector<int64_t>>(it->second))
    throw Error(fmt::format("op {}: missing int-list attribute 'shape'", op));
  return std::get<std::vector<int64_t>>(it->second);
}

}  // namespace

void register_elementwise_ops() {
  auto with_shape = [](ShardingRule r) {
    r.localize = [](Attrs& a, const Types&, const Types&, const Types& local_out) {
      a["shape"] = local_out[0].shape;
    };
    return r;
  };

  register_op(
      {.name = "add",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs&) -> Types {
         expect_inputs("add", in, 2);
         expect_f32("add", in);
         if (in[0].shape == in[1].shape) return {in[0]};
         if (in[1].shape.size() == 1 && !in[0].shape.empty() &&
             in[1].shape[0] == in[0].shape.back())
           return {in[0]};
         type_error("add", in, "shapes must be equal, or b (C) a bias over a (...,C)");
       },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             int db = d[0];
             if (b.shape(n.inputs[1]) != b.shape(n.inputs[0]))
               db = b.emit1(Op::sum_rows, {d[0]}, {}, "grad.sum_rows");
             return std::vector<int>{d[0], db};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 1); },
       .reuse = {{0, 0}, {0, 1}},
       .sharding = {.rule =
                        [](const Types& in, const Types& out, const Attrs&) {
                          return einsum_rule(in[0].shape == in[1].shape ? "*,*->*" : "*c,c->*c", in,
                                             out, {0, 1});
                        }},
       .traits = {Trait::elementwise}});

  register_op(
      {.name = "mul",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs&) { return same_as_first("mul", in, 2); },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             return std::vector<int>{b.mul(d[0], n.inputs[1]), b.mul(d[0], n.inputs[0])};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 1); },
       .reuse = {{0, 0}, {0, 1}},
       .sharding = einsum("*,*->*"),
       .traits = {Trait::elementwise}});

  register_op(
      {.name = "scale",
       .num_inputs = 1,
       .infer = [](const Types& in, const Attrs&) { return same_as_first("scale", in, 1); },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             return std::vector<int>{b.scale(d[0], n.attr_float("s"))};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 1); },
       .reuse = {{0, 0}},
       .sharding = einsum("*->*", {0}),
       .traits = {Trait::elementwise}});

  // mul_scalar(x, s[]) = x * s
  register_op(
      {.name = "mul_scalar",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs&) -> Types {
         expect_inputs("mul_scalar", in, 2);
         expect_f32("mul_scalar", in);
         if (!in[1].shape.empty()) type_error("mul_scalar", in, "s must be a scalar []");
         return {in[0]};
       },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             int dx = b.emit1(Op::mul_scalar, {d[0], n.inputs[1]});
             int ds = b.emit1(Op::sum, {b.mul(d[0], n.inputs[0])});
             return std::vector<int>{dx, ds};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 1); },
       .reuse = {{0, 0}},
       .sharding = einsum("*,->*", {0}),
       .traits = {Trait::elementwise}});

  register_op(
      {.name = "gelu",
       .num_inputs = 1,
       .infer = [](const Types& in, const Attrs&) { return same_as_first("gelu", in, 1); },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             return std::vector<int>{b.emit1(Op::gelu_bwd, {d[0], n.inputs[0]})};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 8); },
       .reuse = {{0, 0}},
       .sharding = einsum("*->*"),
       .traits = {Trait::elementwise}});
  register_op(
      {.name = "gelu_bwd",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs&) { return same_as_first("gelu_bwd", in, 2); },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 12); },
       .reuse = {{0, 1}, {0, 0}},
       .sharding = einsum("*,*->*"),
       .traits = {Trait::elementwise}});

  // swiglu(g, u) = silu(g) * u; f32 or bf16 storage (arithmetic in f32)
  register_op(
      {.name = "swiglu",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs&) { return same_float("swiglu", in, 2); },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             int dy = b.cast(d[0], b.type(n.inputs[0]).dtype);
             return b.emit(Op::swiglu_bwd, {dy, n.inputs[0], n.inputs[1]});
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 6); },
       .reuse = {{0, 0}, {0, 1}},
       .sharding = einsum("*,*->*"),
       .traits = {Trait::elementwise}});
  register_op(
      {.name = "swiglu_bwd",
       .num_inputs = 3,
       .infer =
           [](const Types& in, const Attrs&) {
             Types t = same_float("swiglu_bwd", in, 3);
             return Types{t[0], t[0]};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 10); },
       .reuse = {{0, 1}, {1, 2}},
       .sharding = einsum("*,*,*->*,*"),
       .traits = {Trait::elementwise}});

  register_op(
      {.name = "cast",
       .num_inputs = 1,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("cast", in, 1);
         auto it = a.find("to");
         DType to;
         if (it == a.end() || !std::holds_alternative<std::string>(it->second) ||
             !parse_dtype(std::get<std::string>(it->second), &to) || to == DType::i32)
           type_error("cast", in, "attribute 'to' must be \"f32\" or \"bf16\"");
         if (in[0].dtype == DType::i32) type_error("cast", in, "cannot cast i32");
         return {TensorType{to, in[0].shape}};
       },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             return std::vector<int>{b.cast(d[0], b.type(n.inputs[0]).dtype)};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); },
       .sharding = einsum("*->*"),
       .traits = {Trait::elementwise}});

  auto scalar_reduce = [](const char* name, double flops) {
    return OpDef{.name = name,
                 .num_inputs = 1,
                 .infer = [name](const Types& in, const Attrs&) -> Types {
                   expect_inputs(name, in, 1);
                   expect_f32(name, in);
                   return {TensorType{DType::f32, {}}};
                 },
                 .cost =
                     [flops](const ir::Graph& g, const ir::Node& n) {
                       Cost c = streaming_cost(g, n, 0);
                       c.flops = flops * double(numel(g.value(n.inputs[0]).type.shape));
                       return c;
                     }};
  };
  OpDef sum = scalar_reduce("sum", 1);
  sum.vjp = [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
    return std::vector<int>{
        b.emit1(Op::broadcast_scalar, {d[0]}, {{"shape", b.shape(n.inputs[0])}}, "grad.bcast")};
  };
  sum.sharding = einsum("*->", {0});
  register_op(sum);
  OpDef sumsq = scalar_reduce("sumsq", 2);
  sumsq.vjp = [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
    return std::vector<int>{b.emit1(Op::mul_scalar, {b.scale(n.inputs[0], 2.0), d[0]})};
  };
  sumsq.sharding = einsum("*->");
  register_op(sumsq);

  // sum_rows(x (...,C)) -> (C)
  register_op({.name = "sum_rows",
               .num_inputs = 1,
               .infer = [](const Types& in, const Attrs&) -> Types {
                 expect_inputs("sum_rows", in, 1);
                 expect_f32("sum_rows", in);
                 if (in[0].shape.empty()) type_error("sum_rows", in, "needs rank >= 1");
                 return {TensorType{DType::f32, {in[0].shape.back()}}};
               },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     return std::vector<int>{
                         b.emit1(Op::broadcast_rows, {d[0]}, {{"shape", b.shape(n.inputs[0])}})};
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     Cost c = streaming_cost(g, n, 0);
                     c.flops = double(numel(g.value(n.inputs[0]).type.shape));
                     return c;
                   },
               .sharding = einsum("*c->c", {0})});

  // broadcast_scalar(s []) {shape} -> f32[shape] filled with s
  register_op(
      {.name = "broadcast_scalar",
       .num_inputs = 1,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("broadcast_scalar", in, 1);
         if (!in[0].shape.empty() || in[0].dtype != DType::f32)
           type_error("broadcast_scalar", in, "expects an f32 scalar");
         return {TensorType{DType::f32, attr_shape(a, "broadcast_scalar")}};
       },
       .vjp = [](Builder& b, const ir::Node& n,
                 const std::vector<int>& d) { return std::vector<int>{b.emit1(Op::sum, {d[0]})}; },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); },
       .sharding = with_shape(einsum("->*", {0}))});
  // broadcast_rows(v (C)) {shape (...,C)} -> every row a copy of v
  register_op(
      {.name = "broadcast_rows",
       .num_inputs = 1,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("broadcast_rows", in, 1);
         Shape s = attr_shape(a, "broadcast_rows");
         if (in[0].shape.size() != 1 || s.empty() || s.back() != in[0].shape[0] ||
             in[0].dtype != DType::f32)
           type_error("broadcast_rows", in, "expects f32 (C) and shape (...,C)");
         return {TensorType{DType::f32, s}};
       },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             return std::vector<int>{b.emit1(Op::sum_rows, {d[0]})};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); },
       .sharding = with_shape(einsum("c->*c", {0}))});
  // positions {shape [B,T]} -> i32[B,T] with row t = 0..T-1 (learned position embeddings)
  register_op(
      {.name = "positions",
       .num_inputs = 0,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("positions", in, 0);
         Shape s = attr_shape(a, "positions");
         if (s.empty()) type_error("positions", in, "shape needs rank >= 1");
         return {TensorType{DType::i32, s}};
       },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); },
       .sharding = with_shape(einsum("->*T"))});
  // positions_at(start i32[]) {shape}: positions counted from a runtime start, start + index along
  // the last dim: the new tokens' positions in a decode step (GPT-2's learned position embedding).
  // Inference only (no VJP, nothing to differentiate).
  register_op(
      {.name = "positions_at",
       .num_inputs = 1,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("positions_at", in, 1);
         if (in[0] != TensorType{DType::i32, {}})
           type_error("positions_at", in, "start must be an i32 scalar");
         Shape s = attr_shape(a, "positions_at");
         if (s.empty()) type_error("positions_at", in, "shape needs rank >= 1");
         return {TensorType{DType::i32, s}};
       },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); }});
  // fill {shape, value, dtype}: a constant tensor (the loss seed, the gradient of an unused output)
  register_op(
      {.name = "fill",
       .num_inputs = 0,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("fill", in, 0);
         DType t = DType::f32;
         auto it = a.find("dtype");
         if (it != a.end() &&
             (!std::holds_alternative<std::string>(it->second) ||
              !parse_dtype(std::get<std::string>(it->second), &t) || t == DType::i32))
           type_error("fill", in, "dtype must be \"f32\" or \"bf16\"");
         return {TensorType{t, attr_shape(a, "fill")}};
       },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); },
       .sharding = with_shape(einsum("->*"))});
}

}  // namespace loom::ops
