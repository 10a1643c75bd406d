// Building blocks shared by the model files (internal to models/). The model files are written once
// against Ctx; whether a graph is a full forward (training, evaluation) or one step of incremental
// decoding (ForwardInputs::decoding) is decided here, in the three places it matters: positions,
// attention (rotary position and the key/value cache) and which rows reach the output head.
#pragma once

#include <cmath>
#include <string>

#include "loom/models/architecture.h"
#include "loom/models/model.h"
#include "loom/ops/builder.h"

namespace loom::models::detail {

struct Ctx {
  ops::Builder& b;
  const ModelConfig& c;
  const ForwardInputs& in;
  DType cd = c.dtype;  // compute dtype of matmuls and attention

  int param(const std::string& name) const {
    int v = b.graph().find(name);
    return v;
  }
  // y = x W^T with W stored (out, in) (Llama, nn.Linear); x may already be in the compute dtype.
  int linear(int x, const std::string& w, const std::string& name, DType out = DType::f32) {
    return linear(x, param(w), name, out);
  }
  int linear(int x, int w, const std::string& name, DType out = DType::f32) {
    return b.matmul(b.cast(x, cd), weight(w), false, true, name, out);
  }
  // y = x W with W stored (in, out) (GPT-2 Conv1D).
  int conv1d(int x, const std::string& w, const std::string& name) {
    return b.matmul(b.cast(x, cd), weight(param(w)), false, false, name);
  }
  // The weight w (a param, or computed from params) in the compute dtype. Training casts the f32
  // master where it is read, each step (the cast's gradient flows to the master). A decode step
  // under bf16 reads a param's copy instead (in.weight_copies; model.h: weight_copy_name), made
  // once by its caller with the same rounding: the same bits, without a pass over every weight per
  // token.
  int weight(int w) {
    const ir::Value& v = b.graph().value(w);
    if (!in.weight_copies || v.type.dtype == cd || v.kind != ir::ValueKind::param)
      return b.cast(w, cd);
    const std::string name = weight_copy_name(v.name, cd);
    int copy = b.graph().find(name);
    if (copy < 0) {
      copy = b.graph().add_input(name, {cd, v.type.shape}, ir::ValueKind::param);
      (*in.weight_copies)[copy] = v.name;
    }
    return copy;
  }
  // NormFormer's head-wise scaling of the attention output, folded into the output projection:
  // o_proj(a * s per head) = a (W * s per input feature), so the scale touches the (C, NH*HS)
  // weight instead of every token's activation. `heads_on_rows`: W is stored (NH*HS, C) (GPT-2's
  // Conv1D), else (C, NH*HS) (nn.Linear). Returns the scaled weight, f32.
  int head_scaled(const std::string& w, const std::string& scale, bool heads_on_rows) {
    const int64_t NH = c.n_heads, HS = c.head_size(), C = c.d_model;
    const Shape& ws = b.shape(param(w));
    // s (NH) -> (NH, HS): every head's scale repeated over its features
    int rep =
        b.matmul(b.reshape(param(scale), {NH, 1}),
                 b.emit1(ir::Op::fill, {}, {{"shape", Shape{1, HS}}, {"value", 1.0}}, "ones_hs"),
                 false, false, "head_scale_rep");
    int grid;
    if (heads_on_rows)  // (NH*HS, 1) x (1, C)
      grid = b.matmul(b.reshape(rep, {NH * HS, 1}),
                      b.emit1(ir::Op::fill, {}, {{"shape", Shape{1, C}}, {"value", 1.0}}, "ones_c"),
                      false, false, "head_scale_grid");
    else
      grid = b.emit1(ir::Op::broadcast_rows, {b.reshape(rep, {NH * HS})}, {{"shape", ws}},
                     "head_scale_grid");
    return b.mul(param(w), grid, "head_scaled_proj");
  }
  // Every expert's y[e] = x[e] W[e]^T (tb) or x[e] W[e] over its slots (grouped_matmul), with the
  // stacked experts' weights W (E,out,in) or (E,in,out); x (E,B,S,in).
  int experts_mm(int x, const std::string& w, bool tb, const std::string& name,
                 DType out = DType::f32) {
    ir::Attrs a{{"ta", int64_t(0)}, {"tb", int64_t(tb)}};
    if (out != DType::f32) a["out"] = std::string(dtype_name(out));
    // the slots balanced routing fills (the cost counts those; the kernel skips the empty ones)
    const int64_t S = b.shape(x)[2];
    a["fill"] = std::min(1.0, double(in.T * c.moe.top_k) / double(c.moe.experts * S));
    return b.emit1(ir::Op::grouped_matmul, {b.cast(x, cd), weight(param(w))}, std::move(a), name);
  }
  // A Mixture-of-Experts MLP over n (B,T,C) f32 (ops/moe.cc): the router's logits (B,T,E) f32 (a
  // linear map of n, in f32 even under bf16: Switch Transformer's selective precision, since a
  // rounding can flip a token's experts) pick each token's experts, dispatch moves the tokens into
  // the experts' slots (E,B,S,C) in cd, `experts` maps them through every expert's MLP at once
  // (grouped_matmul over the stacked weights, skipping empty slots) to (E,B,S,C) f32, and combine
  // adds each token's experts' outputs weighted by its gates. Returns (B,T,C) f32; the router's
  // sums go to in.moe. A decode step routes without drops (capacity T): inference never drops a
  // token.
  template <class Experts>
  int moe(int n, int logits, Experts&& experts) {
    const int64_t T = in.T, E = c.moe.experts;
    const int64_t S = in.decoding() ? T : c.moe.capacity(T);
    auto r = b.emit(ir::Op::moe_router, {logits}, {{"top_k", c.moe.top_k}, {"capacity", S}},
                    {"gates", "experts", "slots", "prob_sum", "z_sum", "routed", "kept"});
    if (in.moe) in.moe->push_back({r[3], r[4], r[5], r[6]});
    int xe = b.emit1(ir::Op::moe_dispatch, {b.cast(n, cd), r[1], r[2]},
                     {{"num_experts", E}, {"capacity", S}}, "expert_in");
    return b.emit1(ir::Op::moe_combine, {experts(xe), r[1], r[2], r[0]}, {}, "moe_out");
  }
  // The tokens' positions, i32 (B,T): 0..T-1, or start..start+T-1 when decoding.
  int positions() {
    const ir::Attrs shape{{"shape", Shape{in.B, in.T}}};
    if (in.decoding()) return b.emit1(ir::Op::positions_at, {in.start}, shape, "positions");
    return b.emit1(ir::Op::positions, {}, shape, "positions");
  }
  // Causal attention over q (B,T,NH*HS), k and v (B,T,NKV*HS), returning (B,T,NH*HS) in cd. When
  // decoding, k and v also go into this layer's caches (state values named by the scope: the
  // `layers.0.k_cache` of Llama's first layer), which the queries read.
  int attention(int q, int k, int v, bool rope) {
    const int64_t B = in.B, T = in.T, NH = c.n_heads, NKV = c.kv_heads(), HS = c.head_size();
    q = b.reshape(q, {B, T, NH, HS}, "q4");
    k = b.reshape(k, {B, T, NKV, HS}, "k4");
    v = b.reshape(v, {B, T, NKV, HS}, "v4");
    if (rope) {
      if (in.decoding()) {
        q = b.emit1(ir::Op::rope_at, {q, in.start}, {{"theta", c.rope_theta}}, "q_rot");
        k = b.emit1(ir::Op::rope_at, {k, in.start}, {{"theta", c.rope_theta}}, "k_rot");
      } else {
        q = b.emit1(ir::Op::rope, {q}, {{"theta", c.rope_theta}, {"sign", int64_t(1)}}, "q_rot");
        k = b.emit1(ir::Op::rope, {k}, {{"theta", c.rope_theta}, {"sign", int64_t(1)}}, "k_rot");
      }
    }
    q = b.cast(q, cd);
    k = b.cast(k, cd);
    v = b.cast(v, cd);
    const double scale = 1.0 / std::sqrt(double(HS));
    int o;
    if (in.decoding()) {
      ir::Graph& g = b.graph();
      const ir::TensorType cache{cd, {B, in.cache_len, NKV, HS}};
      int kc = g.add_input(b.scope() + "k_cache", cache, ir::ValueKind::state);
      int vc = g.add_input(b.scope() + "v_cache", cache, ir::ValueKind::state);
      o = b.emit(ir::Op::cached_attention, {q, k, v, kc, vc, in.start}, {{"scale", scale}},
                 {"attn", "k_cache_next", "v_cache_next"})[0];
    } else {
      o = b.emit(ir::Op::attention, {q, k, v}, {{"scale", scale}}, {"attn", "attn_lse"})[0];
    }
    return b.reshape(o, {B, T, NH * HS}, "attn_flat");
  }
  // The rows of h (B,T,C) the output head sees: all of them, or when decoding the last token's
  // (B,1,C) only (a decode step needs the next token's logits, not T rows of V).
  int head_rows(int h) {
    if (!in.decoding() || in.T == 1) return h;
    const int64_t C = b.shape(h).back();
    int flat = b.reshape(h, {in.B, in.T * C}, "hidden_flat");
    int last = b.emit(ir::Op::split, {flat}, {{"sizes", std::vector<int64_t>{(in.T - 1) * C, C}}},
                      {"hidden_rest", "hidden_last"})[1];
    return b.reshape(last, {in.B, 1, C}, "hidden_last_row");
  }
};

}  // namespace loom::models::detail
