// cross_entropy(logits f32 (...,V), targets i32 (...)) -> loss f32 [], dlogits f32 (...,V)
//
// Fused with its gradient: one pass over the logits computes the mean loss over all rows and
// dlogits = (softmax - onehot) / rows, so the backward is a single scaling by the incoming dloss,
// and none where that is the seed of 1 (the loss is this op's own: x * 1 is x, to the bit).
// Attribute `rows` (optional) is the divisor: the row count of the whole batch when this op runs on
// a shard of it (set by the sharding rule's localize), so the shards' losses add up to the global
// mean.
//
// Vocabulary-parallel (Megatron-LM's parallel cross-entropy): where lowering splits V (the head's
// weight split by vocabulary under `megatron`), the logits are never gathered. Each rank makes its
// rows' statistics over its block of V and all of them are gathered (three floats per row):
//   softmax_stats(logits f32 (...,Vl), targets i32 (...)) -> f32 (1, R, 3)
//       per row: m = max over the block, s = sum of exp(x - m), x_t (0 where t is not in the block)
//   cross_entropy(logits, targets, stats f32 (k, R, 3)) -> loss, dlogits
//       logsumexp = M + log sum_j s_j exp(m_j - M) (M = max_j m_j: the same on every rank), dlogits
//       = (exp(x - logsumexp) - onehot) / rows over the block; the loss is a partial sum over the
//       split: the rank holding a row's target adds logsumexp - x_t, the others nothing.
// Their targets are relative to the rank's block (shard_index: -1 outside it; attribute masked).
#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using Types = std::vector<ir::TensorType>;

// logits f32 (...,V) and targets i32 (...) of the same rows
void check_logits(std::string_view op, const Types& in) {
  Shape rows(in[0].shape.begin(), in[0].shape.empty() ? in[0].shape.end() : in[0].shape.end() - 1);
  if (in[0].dtype != DType::f32 || in[1].dtype != DType::i32 || in[0].shape.empty() ||
      in[1].shape != rows)
    type_error(op, in, "expects logits f32 (...,V) and targets i32 (...)");
}

// Lowering with V split (see above): the targets made relative to the rank's block, the blocks'
// statistics gathered over every axis that splits V.
void prepare_split_vocab(LowerContext& c, const FactorRule& rule, std::vector<int>& in,
                         ir::Attrs& attrs) {
  const std::vector<std::string>& axes = c.factor_axes(rule.operands[0].back()[0]);
  if (axes.empty()) return;
  in[1] = index_into_block(c, in[1], axes, c.type(in[0]).shape.back());
  int stats = c.emit(ir::Op::softmax_stats, {in[0], in[1]}, {{"masked", int64_t(1)}});
  for (const std::string& a : axes)
    stats = c.emit(ir::Op::all_gather, {stats},
                   {{"axis", a}, {"dim", int64_t(0)}, {"n", c.axis_size(a)}});
  in.push_back(stats);
  attrs["masked"] = int64_t(1);
}

}  // namespace

void register_loss_ops() {
  register_op(
      {.name = "cross_entropy",
       .num_inputs = -1,
       .infer =
           [](const Types& in, const ir::Attrs&) {
             if (in.size() != 2 && in.size() != 3)
               type_error("cross_entropy", in, "expects 2 inputs (3 with the vocabulary split)");
             check_logits("cross_entropy", in);
             if (in.size() == 3 && (in[2].dtype != DType::f32 || in[2].shape.size() != 3 ||
                                    in[2].shape[1] != numel(in[1].shape) || in[2].shape[2] != 3))
               type_error("cross_entropy", in, "expects stats f32 (k, rows, 3) as its third input");
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
       // losses over the global row count), and the vocabulary (a partial sum too, with the
       // statistics above gathered first).
       .sharding = {.rule = [](const Types& in, const Types& out,
                               const ir::Attrs&) { return einsum_rule("*v,*->,*v", in, out); },
                    .localize =
                        [](ir::Attrs& a, const Types& global_in, const Types&, const Types&) {
                          if (!a.count("rows")) a["rows"] = numel(global_in[1].shape);
                        },
                    .prepare = prepare_split_vocab}});
  register_op({.name = "softmax_stats",
               .num_inputs = 2,
               .infer =
                   [](const Types& in, const ir::Attrs&) {
                     expect_inputs("softmax_stats", in, 2);
                     check_logits("softmax_stats", in);
                     return Types{{DType::f32, {1, numel(in[1].shape), 3}}};
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     Cost c = streaming_cost(g, n, 0);
                     c.flops = 3.0 * double(numel(g.value(n.inputs[0]).type.shape));
                     return c;
                   }});
}

}  // namespace loom::ops
