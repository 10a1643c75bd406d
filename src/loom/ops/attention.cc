// Causal grouped-query self-attention and RoPE.
//
// attention(q (B,T,NH,HS), k (B,T,NKV,HS), v (B,T,NKV,HS)) {scale} -> o (B,T,NH,HS), lse f32
// (B,NH,T)
//   q, k, v share a dtype (f32 or bf16) which o keeps; softmax statistics are f32. NH % NKV == 0.
//   The kernel never stores the (T,T) scores; the backward recomputes them from lse.
// attention_bwd(do, q, k, v, o, lse) {scale} -> dq, dk, dv
// rope(x (B,T,NH,HS)) {theta, sign}: Hugging Face rotate-half rotary embedding at positions 0..T-1;
//   its VJP is the rotation by the opposite angle (sign = -sign).
//
// Incremental decoding (inference only: no VJP, no sharding rule; loom sample runs one process):
// rope_at(x (B,Tn,NH,HS), start i32[]) {theta}: rope at positions start..start+Tn-1.
// cached_attention(q (B,Tn,NH,HS), k, v (B,Tn,NKV,HS), kc, vc (B,S,NKV,HS), start i32[]) {scale}
//   -> o (B,Tn,NH,HS), kc', vc': stores k, v in the caches at start..start+Tn-1 (in place: kc', vc'
//   are kc, vc), then query i attends to cache positions 0..start+i. All but start share a dtype.
#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using ir::Attrs;
using ir::TensorType;
using Types = std::vector<TensorType>;

void check_qkv(std::string_view op, const Types& in, const Types& qkv) {
  const Shape &q = qkv[0].shape, &k = qkv[1].shape, &v = qkv[2].shape;
  if (q.size() != 4 || k.size() != 4 || k != v || q[0] != k[0] || q[1] != k[1] || q[3] != k[3])
    type_error(op, in, "expects q (B,T,NH,HS) and k, v (B,T,NKV,HS)");
  if (k[2] == 0 || q[2] % k[2] != 0) type_error(op, in, "NH must be a multiple of NKV");
  if (qkv[0].dtype != qkv[1].dtype || qkv[1].dtype != qkv[2].dtype || qkv[0].dtype == DType::i32)
    type_error(op, in, "q, k, v must share a float dtype");
}

TensorType lse_type(const Shape& q) { return {DType::f32, {q[0], q[2], q[1]}}; }

double attention_flops(const Shape& q) {
  // causal: about half of the T*T score matrix; q.k and p.v are 2*HS flops per score each.
  double B = q[0], T = q[1], NH = q[2], HS = q[3];
  return B * NH * (T * (T + 1) / 2) * HS * 4;
}

}  // namespace

void register_attention_ops() {
  register_op({.name = "attention",
               .num_inputs = 3,
               .infer =
                   [](const Types& in, const Attrs&) {
                     expect_inputs("attention", in, 3);
                     check_qkv("attention", in, in);
                     return Types{in[0], lse_type(in[0].shape)};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     if (d[1] >= 0) throw Error("attention: lse is not differentiable");
                     int dout = b.cast(d[0], b.type(n.inputs[0]).dtype);
                     return b.emit(
                         Op::attention_bwd,
                         {dout, n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1]},
                         n.attrs, {"grad.attn.q", "grad.attn.k", "grad.attn.v"});
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     Cost c = streaming_cost(g, n, 0);
                     c.flops = attention_flops(g.value(n.inputs[0]).type.shape);
                     return c;
                   },
               // attention reads every earlier key; rotary pairs span the head). A query head block
               // (h g) uses key head h, so splitting h keeps grouped-query heads together.
               .sharding = einsum("bT(hg)D,bThD,bThD->bT(hg)D,b(hg)T")});
  register_op({.name = "attention_bwd",
               .num_inputs = 6,
               .infer =
                   [](const Types& in, const Attrs&) {
                     expect_inputs("attention_bwd", in, 6);
                     check_qkv("attention_bwd", in, {in[1], in[2], in[3]});
                     if (in[0] != in[1] || in[4] != in[1] || in[5] != lse_type(in[1].shape))
                       type_error("attention_bwd", in, "do and o must match q; lse (B,NH,T)");
                     return Types{in[1], in[2], in[3]};
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     Cost c = streaming_cost(g, n, 0);
                     // recompute q.k, then dv, dp, dq, dk: five score-sized matmuls
                     c.flops = attention_flops(g.value(n.inputs[1]).type.shape) * 2.5;
                     return c;
                   },
               .sharding = einsum("bT(hg)D,bT(hg)D,bThD,bThD,bT(hg)D,b(hg)T->bT(hg)D,bThD,bThD")});

  register_op(
      {.name = "rope",
       .num_inputs = 1,
       .infer =
           [](const Types& in, const Attrs&) {
             expect_inputs("rope", in, 1);
             if (in[0].dtype != DType::f32 || in[0].shape.size() != 4 || in[0].shape[3] % 2 != 0)
               type_error("rope", in, "expects f32 (B,T,NH,HS) with even HS");
             return Types{in[0]};
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             ir::Attrs a = n.attrs;
             a["sign"] = -n.attr_int("sign", 1);
             return std::vector<int>{b.emit1(Op::rope, {d[0]}, a, "grad.rope")};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 3); },
       .reuse = {{0, 0}},
       .sharding = einsum("bThD->bThD", {0})});

  register_op(
      {.name = "rope_at",
       .num_inputs = 2,
       .infer =
           [](const Types& in, const Attrs&) {
             expect_inputs("rope_at", in, 2);
             if (in[0].dtype != DType::f32 || in[0].shape.size() != 4 || in[0].shape[3] % 2 != 0 ||
                 in[1] != TensorType{DType::i32, {}})
               type_error("rope_at", in, "expects f32 (B,T,NH,HS) with even HS and an i32 start");
             return Types{in[0]};
           },
       .cost = [](const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 3); },
       .reuse = {{0, 0}}});
  register_op({.name = "cached_attention",
               .num_inputs = 6,
               .infer =
                   [](const Types& in, const Attrs&) {
                     expect_inputs("cached_attention", in, 6);
                     check_qkv("cached_attention", in, {in[0], in[1], in[2]});
                     const Shape &k = in[1].shape, &kc = in[3].shape;
                     if (in[3] != in[4] || in[3].dtype != in[1].dtype || kc.size() != 4 ||
                         kc[0] != k[0] || kc[2] != k[2] || kc[3] != k[3] || kc[1] < k[1])
                       type_error(
                           "cached_attention", in,
                           "the caches must be (B,S,NKV,HS) of k's dtype with S >= the new tokens");
                     if (in[5] != TensorType{DType::i32, {}})
                       type_error("cached_attention", in, "start must be an i32 scalar");
                     return Types{in[0], in[3], in[4]};
                   },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     // new tokens against the whole cache at most: q.k and p.v, 2*HS flops per
                     // score each
                     const Shape &q = g.value(n.inputs[0]).type.shape,
                                 &kc = g.value(n.inputs[3]).type.shape;
                     Cost c = streaming_cost(g, n, 0);
                     c.flops = double(q[0]) * double(q[2]) * double(q[1]) * double(kc[1]) *
                               double(q[3]) * 4;
                     return c;
                   },
               .inplace = {{1, 3}, {2, 4}}});

  // Sharding rules (ops/sharding_rule.h): heads and batch split; time and head size do not (causal
}

}  // namespace loom::ops
