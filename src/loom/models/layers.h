// Building blocks shared by the model files (internal to models/).
#pragma once

#include <cmath>
#include <string>

#include "loom/models/model.h"
#include "loom/ops/builder.h"

namespace loom::models::detail {

struct Ctx {
  ops::Builder& b;
  const ModelConfig& c;
  DType cd;  // compute dtype of matmuls and attention

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
  // Causal attention over q (B,T,NH*HS), k and v (B,T,NKV*HS), returning (B,T,NH*HS) in cd.
  int attention(int q, int k, int v, int64_t B, int64_t T, bool rope) {
    int64_t NH = c.n_heads, NKV = c.kv_heads(), HS = c.head_size();
    q = b.reshape(q, {B, T, NH, HS}, "q4");
    k = b.reshape(k, {B, T, NKV, HS}, "k4");
    v = b.reshape(v, {B, T, NKV, HS}, "v4");
    if (rope) {
      q = b.emit1("rope", {q}, {{"theta", c.rope_theta}, {"sign", int64_t(1)}}, "q_rot");
      k = b.emit1("rope", {k}, {{"theta", c.rope_theta}, {"sign", int64_t(1)}}, "k_rot");
    }
    q = b.cast(q, cd);
    k = b.cast(k, cd);
    v = b.cast(v, cd);
    auto o = b.emit("attention", {q, k, v}, {{"scale", 1.0 / std::sqrt(double(HS))}},
                    {"attn", "attn_lse"});
    return b.reshape(o[0], {B, T, NH * HS}, "attn_flat");
  }
};

}  // namespace loom::models::detail
