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
    return b.matmul(b.cast(x, cd), b.cast(param(w), cd), false, true, name, out);
  }
  // y = x W with W stored (in, out) (GPT-2 Conv1D).
  int conv1d(int x, const std::string& w, const std::string& name) {
    return b.matmul(b.cast(x, cd), b.cast(param(w), cd), false, false, name);
  }
  // The tokens' positions, i32 (B,T): 0..T-1, or start..start+T-1 when decoding.
  int positions() {
    const ir::Attrs shape{{"shape", Shape{in.B, in.T}}};
    if (in.decoding()) return b.emit1("positions_at", {in.start}, shape, "positions");
    return b.emit1("positions", {}, shape, "positions");
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
        q = b.emit1("rope_at", {q, in.start}, {{"theta", c.rope_theta}}, "q_rot");
        k = b.emit1("rope_at", {k, in.start}, {{"theta", c.rope_theta}}, "k_rot");
      } else {
        q = b.emit1("rope", {q}, {{"theta", c.rope_theta}, {"sign", int64_t(1)}}, "q_rot");
        k = b.emit1("rope", {k}, {{"theta", c.rope_theta}, {"sign", int64_t(1)}}, "k_rot");
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
      o = b.emit("cached_attention", {q, k, v, kc, vc, in.start}, {{"scale", scale}},
                 {"attn", "k_cache_next", "v_cache_next"})[0];
    } else {
      o = b.emit("attention", {q, k, v}, {{"scale", scale}}, {"attn", "attn_lse"})[0];
    }
    return b.reshape(o, {B, T, NH * HS}, "attn_flat");
  }
  // The rows of h (B,T,C) the output head sees: all of them, or when decoding the last token's
  // (B,1,C) only (a decode step needs the next token's logits, not T rows of V).
  int head_rows(int h) {
    if (!in.decoding() || in.T == 1) return h;
    const int64_t C = b.shape(h).back();
    int flat = b.reshape(h, {in.B, in.T * C}, "hidden_flat");
    int last = b.emit("split", {flat}, {{"sizes", std::vector<int64_t>{(in.T - 1) * C, C}}},
                      {"hidden_rest", "hidden_last"})[1];
    return b.reshape(last, {in.B, 1, C}, "hidden_last_row");
  }
};

}  // namespace loom::models::detail
