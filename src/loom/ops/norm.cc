// RMSNorm and LayerNorm over the last dim, each with a backward op that returns every input
// gradient.
//
// rmsnorm(x (...,C), w (C)) {eps} -> y (...,C), rstd (...)
// layernorm(x (...,C), w (C), b (C)) {eps} -> y (...,C), mean (...), rstd (...)
// The statistics are auxiliary outputs saved for the backward; they carry no gradient of their own.
#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using ir::Attrs;
using ir::TensorType;
using Types = std::vector<TensorType>;

void check_norm_inputs(std::string_view op, const Types& in, size_t n) {
  expect_inputs(op, in, n);
  for (const auto& t : in)
    if (t.dtype != DType::f32) type_error(op, in, "expects f32 inputs");
  if (in[0].shape.empty()) type_error(op, in, "x needs rank >= 1");
  for (size_t i = 1; i < n; ++i)
    if (in[i].shape != Shape{in[0].shape.back()}) type_error(op, in, "weights must be (C)");
}

TensorType stats_type(const TensorType& x) {
  return {DType::f32, Shape(x.shape.begin(), x.shape.end() - 1)};
}

void no_stat_grads(std::string_view op, const std::vector<int>& d) {
  for (size_t i = 1; i < d.size(); ++i)
    if (d[i] >= 0) throw Error(std::string(op) + ": its statistics outputs are not differentiable");
}

}  // namespace

void register_norm_ops() {
  register_op(
      {.name = "rmsnorm",
       .num_inputs = 2,
       .infer =
           [](const Types& in, const Attrs&) {
             check_norm_inputs("rmsnorm", in, 2);
             return Types{in[0], stats_type(in[0])};
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             no_stat_grads("rmsnorm", d);
             return b.emit(Op::rmsnorm_bwd, {d[0], n.inputs[0], n.inputs[1], n.outputs[1]}, {},
                           {"grad.rmsnorm.x", "grad.rmsnorm.w"});
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 4); },
       .sharding = einsum("*C,C->*C,*"),
       .traits = {Trait::norm}});
  // rmsnorm_bwd(dy, x, w, rstd) -> dx, dw
  register_op(
      {.name = "rmsnorm_bwd",
       .num_inputs = 4,
       .infer =
           [](const Types& in, const Attrs&) {
             expect_inputs("rmsnorm_bwd", in, 4);
             check_norm_inputs("rmsnorm_bwd", {in[1], in[2]}, 2);
             if (in[0] != in[1] || in[3] != stats_type(in[1]))
               type_error("rmsnorm_bwd", in, "dy must match x, rstd its rows");
             return Types{in[1], in[2]};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 8); },
       .sharding = einsum("*C,*C,C,*->*C,C")});

  register_op(
      {.name = "layernorm",
       .num_inputs = 3,
       .infer =
           [](const Types& in, const Attrs&) {
             check_norm_inputs("layernorm", in, 3);
             return Types{in[0], stats_type(in[0]), stats_type(in[0])};
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             no_stat_grads("layernorm", d);
             return b.emit(Op::layernorm_bwd,
                           {d[0], n.inputs[0], n.inputs[1], n.outputs[1], n.outputs[2]}, {},
                           {"grad.layernorm.x", "grad.layernorm.w", "grad.layernorm.b"});
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 7); },
       .sharding = einsum("*C,C,C->*C,*,*"),
       .traits = {Trait::norm}});
  // layernorm_bwd(dy, x, w, mean, rstd) -> dx, dw, db
  register_op(
      {.name = "layernorm_bwd",
       .num_inputs = 5,
       .infer =
           [](const Types& in, const Attrs&) {
             expect_inputs("layernorm_bwd", in, 5);
             check_norm_inputs("layernorm_bwd", {in[1], in[2]}, 2);
             if (in[0] != in[1] || in[3] != stats_type(in[1]) || in[4] != in[3])
               type_error("layernorm_bwd", in, "dy must match x, mean/rstd its rows");
             return Types{in[1], in[2], in[2]};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 10); },
       .sharding = einsum("*C,*C,C,*,*->*C,C,C")});

  // Sharding rules (ops/sharding_rule.h): the normalised dim C is whole on every rank.
}

}  // namespace loom::ops
