// Optimizer ops.
//
// adamw(p, g, m, v, hyper f32[3], gscale f32[]) {beta1, beta2, eps, wd} -> p', m', v'
//   In place: p', m', v' share memory with p, m, v (the planner checks nothing reads the old ones
//   after). hyper = {lr, 1 - beta1^t, 1 - beta2^t} is fed per step so schedules never rebuild the
//   graph; gscale is the clipping coefficient. Formula in kernels/cpu/kernels.h.
// clip_coef(total f32[]) {max_norm} -> coef f32[], norm f32[]
//   total is the sum of squared gradient norms; coef = min(1, max_norm / (sqrt(total) + 1e-6)).
#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::ops {

void register_optim_ops() {
  using Types = std::vector<ir::TensorType>;
  register_op({.name = "adamw",
               .num_inputs = 6,
               .infer =
                   [](const Types& in, const ir::Attrs&) {
                     expect_inputs("adamw", in, 6);
                     for (int i = 0; i < 4; ++i)
                       if (in[i] != in[0] || in[i].dtype != DType::f32)
                         type_error("adamw", in, "p, g, m, v must be f32 of one shape");
                     if (in[4] != ir::TensorType{DType::f32, {3}} ||
                         in[5] != ir::TensorType{DType::f32, {}})
                       type_error("adamw", in, "hyper must be f32[3] and gscale f32[]");
                     return Types{in[0], in[0], in[0]};
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     Cost c;
                     double e = double(numel(g.value(n.inputs[0]).type.shape));
                     c.flops = 12 * e;
                     c.bytes_read = 16 * e;
                     c.bytes_written = 12 * e;
                     return c;
                   },
               .inplace = {{0, 0}, {1, 2}, {2, 3}},
               // moments; the hyper-parameters and the clipping coefficient are whole everywhere.
               .sharding = einsum("*,*,*,*,H,->*,*,*"),
               .traits = {Trait::optimizer}});
  register_op({.name = "clip_coef",
               .num_inputs = 1,
               .infer =
                   [](const Types& in, const ir::Attrs&) {
                     expect_inputs("clip_coef", in, 1);
                     if (in[0] != ir::TensorType{DType::f32, {}})
                       type_error("clip_coef", in, "expects an f32 scalar");
                     return Types{in[0], in[0]};
                   },
               .cost =
                   [](const ir::Graph&, const ir::Node&) {
                     return Cost{0, 4, 8};
                   }});

  // Sharding rules (ops/sharding_rule.h): AdamW is elementwise over a parameter, its gradient and
}

}  // namespace loom::ops
