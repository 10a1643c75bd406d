// cross_entropy(logits f32 (...,V), targets i32 (...)) -> loss f32 [], dlogits f32 (...,V)
//
// Fused with its gradient: one pass over the logits computes the mean loss over all rows and
// dlogits = (softmax - onehot) / rows, so the backward is a single scaling by the incoming dloss,
// and none where that is the seed of 1 (the loss is this op's own: x * 1 is x, to the bit).
// Attribute `rows` (optional) is the divisor: the row count of the whole batch when this op runs on
// a shard of it (set by the sharding rule's localize), so the shards' losses add up to the global
// mean.
#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

void register_loss_ops() {
  using Types = std::vector<ir::TensorType>;
  register_op(
      {.name = "cross_entropy",
       .num_inputs = 2,
       .infer =
           [](const Types& in, const ir::Attrs&) {
             expect_inputs("cross_entropy", in, 2);
             Shape rows(in[0].shape.begin(),
                        in[0].shape.empty() ? in[0].shape.end() : in[0].shape.end() - 1);
             if (in[0].dtype != DType::f32 || in[1].dtype != DType::i32 || in[0].shape.empty() ||
                 in[1].shape != rows)
               type_error("cross_entropy", in, "expects logits f32 (...,V) and targets i32 (...)");
             return Types{{DType::f32, {}}, in[0]};
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             if (d[1] >= 0) throw Error("cross_entropy: dlogits is not differentiable");
             const ir::Graph& g = b.graph();
             const int seed = g.value(d[0]).producer;
             if (seed >= 0 && g.node(seed).op == Op::fill &&
                 g.node(seed).attr_float("value", 0) == 1.0)
               return std::vector<int>{n.outputs[1], -1};
             int dl = b.emit1(Op::mul_scalar, {n.outputs[1], d[0]}, {}, "grad.logits");
             return std::vector<int>{dl, -1};
           },
       .cost =
           [](const ir::Graph& g, const ir::Node& n) {
             Cost c = streaming_cost(g, n, 0);
             c.flops = 5.0 * double(numel(g.value(n.inputs[0]).type.shape));
             return c;
           },
       .reuse = {{1, 0}},
       // Sharding rule (ops/sharding_rule.h): rows split (the loss becomes a partial sum of row
       // losses over the global row count), the vocabulary does not.
       .sharding = {.rule = [](const Types& in, const Types& out,
                               const ir::Attrs&) { return einsum_rule("*V,*->,*V", in, out); },
                    .localize =
                        [](ir::Attrs& a, const Types& global_in, const Types&, const Types&) {
                          if (!a.count("rows")) a["rows"] = numel(global_in[1].shape);
                        }}});
}

}  // namespace loom::ops
