// matmul and embedding.
//
// matmul(a, b) {ta, tb, out, batch}: C = op(A) op(B) on 2-D views. Without batch, every operand is
// viewed as 2-D by merging its leading dims: A is (M,K) (or (K,M) when ta), B is (K,N) (or (N,K)
// when tb). The output keeps A's leading dims when ta = 0 (x (B,T,C) @ W^T -> (B,T,out)), else is
// (M,N) (dW = dY^T X over all B*T rows). With batch = 1, both are rank 3 with an equal leading
// batch dim. Inputs are both f32 or both bf16; `out` ("f32" default, or "bf16") is the output
// dtype; accumulation is always f32.
//
// Worked VJP (2-D, ta = tb = 0): C = A B, dA = dC B^T, dB = A^T dC; the other three cases follow by
// transposing, and each gradient is reshaped back to its operand's shape.
#include "loom/ops/linear.h"

#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using ir::Attrs;
using ir::TensorType;
using Types = std::vector<TensorType>;

// Lowering with the vocabulary (factor f, `local` rows on this rank) split: the ids (operand 0)
// made relative to the rank's block of it.
void index_ids(LowerContext& c, int f, std::vector<int>& in, Attrs& attrs, int64_t local) {
  const std::vector<std::string>& axes = c.factor_axes(f);
  if (axes.empty()) return;
  in[0] = index_into_block(c, in[0], axes, local);
  attrs["masked"] = int64_t(1);
}

int64_t get_int(const Attrs& a, const char* k, int64_t d) {
  auto it = a.find(k);
  if (it == a.end()) return d;
  if (auto* v = std::get_if<int64_t>(&it->second)) return *v;
  throw Error(fmt::format("matmul: attribute {} must be an integer", k));
}

MatmulDims matmul_dims(const Types& in, const Attrs& a) {
  expect_inputs("matmul", in, 2);
  bool ta = get_int(a, "ta", 0), tb = get_int(a, "tb", 0);
  bool batched = get_int(a, "batch", 0);
  const Shape &sa = in[0].shape, &sb = in[1].shape;
  if (in[0].dtype != in[1].dtype || in[0].dtype == DType::i32)
    type_error("matmul", in, "inputs must both be f32 or both bf16");
  if (sa.size() < 2 || sb.size() < 2) type_error("matmul", in, "inputs must have rank >= 2");
  MatmulDims d;
  d.ta = ta;
  d.tb = tb;
  int64_t a_rows, b_rows;
  if (batched) {
    if (sa.size() != 3 || sb.size() != 3 || sa[0] != sb[0])
      type_error("matmul", in, "batch = 1 needs rank-3 inputs with equal batch dims");
    d.batch = sa[0];
    a_rows = sa[1];
    b_rows = sb[1];
  } else {
    a_rows = numel(sa) / std::max<int64_t>(sa.back(), 1);
    b_rows = numel(sb) / std::max<int64_t>(sb.back(), 1);
    if (sa.back() == 0) a_rows = 0;
    if (sb.back() == 0) b_rows = 0;
  }
  int64_t ka = ta ? a_rows : sa.back();
  d.M = ta ? sa.back() : a_rows;
  int64_t kb = tb ? sb.back() : b_rows;
  d.N = tb ? b_rows : sb.back();
  if (ka != kb)
    type_error("matmul", in,
               fmt::format("contraction dims differ ({} vs {}) with ta={} tb={}", ka, kb, ta, tb));
  d.K = ka;
  return d;
}

DType out_dtype(const Attrs& a) {
  auto it = a.find("out");
  if (it == a.end()) return DType::f32;
  DType t;
  if (!std::holds_alternative<std::string>(it->second) ||
      !parse_dtype(std::get<std::string>(it->second), &t) || t == DType::i32)
    throw Error("matmul: attribute out must be \"f32\" or \"bf16\"");
  return t;
}

Types matmul_infer(const Types& in, const Attrs& a) {
  MatmulDims d = matmul_dims(in, a);
  if (out_dtype(a) == DType::bf16 && in[0].dtype != DType::bf16)
    type_error("matmul", in, "out = \"bf16\" needs bf16 inputs");
  Shape out;
  if (get_int(a, "batch", 0))
    out = {d.batch, d.M, d.N};
  else if (!get_int(a, "ta", 0)) {
    out.assign(in[0].shape.begin(), in[0].shape.end() - 1);
    out.push_back(d.N);
  } else
    out = {d.M, d.N};
  return {TensorType{out_dtype(a), out}};
}

std::vector<int> matmul_vjp(Builder& b, const ir::Node& n, const std::vector<int>& d) {
  int A = n.inputs[0], B = n.inputs[1];
  bool ta = n.attr_int("ta", 0), tb = n.attr_int("tb", 0);
  int64_t batch = n.attr_int("batch", 0);
  // An operand that is a bf16 copy of an f32 tensor (a weight's cast, a normalised activation's
  // cast) gets its gradient straight in f32: the GEMM accumulates in f32 anyway, and rounding the
  // gradient to bf16 only to widen it again in the cast's VJP would lose precision and cost a pass.
  auto grad_dtype = [&](int v) {
    const ir::Value& val = b.graph().value(v);
    if (val.type.dtype == DType::bf16 && val.kind == ir::ValueKind::node) {
      const ir::Node& p = b.graph().node(val.producer);
      if (p.op == Op::cast && b.type(p.inputs[0]).dtype == DType::f32) return DType::f32;
    }
    return val.type.dtype;
  };
  DType da_t = grad_dtype(A), db_t = grad_dtype(B);
  int dC = b.cast(d[0], b.type(A).dtype);  // bf16 inputs: the incoming gradient joins them in bf16
  auto mm = [&](int x, int y, bool tx, bool ty, DType out, int like) {
    ir::Attrs at{{"ta", int64_t(tx)}, {"tb", int64_t(ty)}};
    if (out != DType::f32) at["out"] = std::string(dtype_name(out));
    if (batch) at["batch"] = int64_t(1);
    int r = b.emit1(Op::matmul, {x, y}, std::move(at), "grad.mm");
    return b.reshape(r, b.shape(like));
  };
  int dA, dB;
  if (!ta && !tb) {
    dA = mm(dC, B, false, true, da_t, A);
    dB = mm(A, dC, true, false, db_t, B);
  } else if (!ta && tb) {
    dA = mm(dC, B, false, false, da_t, A);
    dB = mm(dC, A, true, false, db_t, B);
  } else if (ta && !tb) {
    dA = mm(B, dC, false, true, da_t, A);
    dB = mm(A, dC, false, false, db_t, B);
  } else {
    dA = mm(B, dC, true, true, da_t, A);
    dB = mm(dC, A, true, true, db_t, B);
  }
  return {dA, dB};
}

Cost matmul_cost(const ir::Graph& g, const ir::Node& n) {
  Types in{g.value(n.inputs[0]).type, g.value(n.inputs[1]).type};
  MatmulDims d = matmul_dims(in, n.attrs);
  Cost c = streaming_cost(g, n, 0);
  c.flops = 2.0 * double(d.batch) * double(d.M) * double(d.N) * double(d.K);
  return c;
}

}  // namespace

MatmulDims matmul_dims(const ir::Graph& g, const ir::Node& n) {
  return matmul_dims(Types{g.value(n.inputs[0]).type, g.value(n.inputs[1]).type}, n.attrs);
}

void register_linear_ops() {
  register_op(
      {.name = "matmul",
       .num_inputs = 2,
       .infer = matmul_infer,
       .vjp = matmul_vjp,
       .cost = matmul_cost,
       // dim leaves the product a partial sum; dW = dY^T X contracts over every leading dim.
       .sharding = {.rule = [](const Types& in, const Types& out, const Attrs& a) {
         const bool ta = get_int(a, "ta", 0), tb = get_int(a, "tb", 0);
         const size_t ra = in[0].shape.size(), rb = in[1].shape.size();
         if (get_int(a, "batch", 0))
           return einsum_rule(std::string(ta ? "bkm," : "bmk,") + (tb ? "bnk" : "bkn") + "->bmn",
                              in, out);
         if (!ta && rb == 2) return einsum_rule(tb ? "*k,nk->*n" : "*k,kn->*n", in, out);
         if (ta && !tb && ra == rb &&
             Shape(in[0].shape.begin(), in[0].shape.end() - 1) ==
                 Shape(in[1].shape.begin(), in[1].shape.end() - 1))
           return einsum_rule("*m,*n->mn", in, out);
         if (ta && tb && ra == 2 && rb == 2) return einsum_rule("km,nk->mn", in, out);
         return fixed_rule(in, out);
       }}});

  // embedding(ids i32[...], table f32[V,C]) -> f32[..., C]
  register_op(
      {.name = "embedding",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs&) -> Types {
         expect_inputs("embedding", in, 2);
         if (in[0].dtype != DType::i32 || in[1].dtype != DType::f32 || in[1].shape.size() != 2)
           type_error("embedding", in, "expects ids i32[...] and table f32[V,C]");
         Shape s = in[0].shape;
         s.push_back(in[1].shape[1]);
         return {TensorType{DType::f32, s}};
       },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             int64_t V = b.shape(n.inputs[1])[0];
             int dt = b.emit1(Op::embedding_bwd, {n.inputs[0], d[0]}, {{"V", V}}, "grad.embedding");
             return std::vector<int>{-1, dt};
           },
       .cost =
           [](const ir::Graph& g, const ir::Node& n) {
             Cost c;
             double out = double(numel(g.value(n.outputs[0]).type.shape)) * 4;
             c.bytes_read = out + double(numel(g.value(n.inputs[0]).type.shape)) * 4;
             c.bytes_written = out;
             return c;
           },
       // embedding: rows and channels split, and the vocabulary (Megatron-LM's vocabulary-parallel
       // embedding): each rank looks up the ids in its block of the table (shard_index makes them
       // relative to it, -1 elsewhere: a zero row) and the result is a partial sum over the split.
       .sharding = {.rule = [](const Types& in, const Types& out,
                               const Attrs&) { return einsum_rule("*,vc->*c", in, out); },
                    .prepare =
                        [](LowerContext& c, const FactorRule& r, std::vector<int>& in,
                           Attrs& attrs) {
                          index_ids(c, r.operands[1][0][0], in, attrs, c.type(in[1]).shape[0]);
                        }}});
  // embedding_bwd(ids i32[...], dy f32[..., C]) {V} -> f32[V,C]
  register_op(
      {.name = "embedding_bwd",
       .num_inputs = 2,
       .infer = [](const Types& in, const Attrs& a) -> Types {
         expect_inputs("embedding_bwd", in, 2);
         Shape expect = in[0].shape;
         if (!in[1].shape.empty()) expect.push_back(in[1].shape.back());
         if (in[0].dtype != DType::i32 || in[1].dtype != DType::f32 || in[1].shape != expect)
           type_error("embedding_bwd", in, "expects ids i32[...] and dy f32[...,C]");
         int64_t V = get_int(a, "V", -1);
         if (V <= 0) type_error("embedding_bwd", in, "needs attribute V > 0");
         return {TensorType{DType::f32, {V, in[1].shape.back()}}};
       },
       .cost =
           [](const ir::Graph& g, const ir::Node& n) {
             Cost c = streaming_cost(g, n, 0);
             c.flops = double(numel(g.value(n.inputs[1]).type.shape));
             return c;
           },
       // the table's rows split too: each rank sums the ids of its block of the vocabulary
       .sharding = {.rule = [](const Types& in, const Types& out,
                               const Attrs&) { return einsum_rule("*,*c->vc", in, out); },
                    .localize = [](Attrs& a, const Types&, const Types&,
                                   const Types& local_out) { a["V"] = local_out[0].shape[0]; },
                    .prepare =
                        [](LowerContext& c, const FactorRule& r, std::vector<int>& in,
                           Attrs& attrs) {
                          index_ids(c, r.results[0][0][0], in, attrs, get_int(attrs, "V", 0));
                        }}});

  // Sharding rules (ops/sharding_rule.h). matmul: the rows of x @ W^T split freely, the contraction
}

}  // namespace loom::ops
