// Llama: RMSNorm, RoPE (rotate-half), grouped-query attention, SwiGLU MLP, untied output head.
//   x = embed(tokens)                                   (B,T,C)
//   per layer: h = x + o_proj(attn(rope(q), rope(k), v)) of rmsnorm(x)
//              x = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = rmsnorm(h)
//   logits = lm_head(rmsnorm(x))                         (B,T,V)
#include <fmt/format.h>

#include "loom/models/layers.h"

namespace loom::models::detail {

int build_llama(Ctx& x, int tokens, int64_t B, int64_t T) {
  ops::Builder& b = x.b;
  const double eps = x.c.norm_eps;
  int h = b.emit1("embedding", {tokens, x.param("model.embed_tokens.weight")}, {}, "embed");
  for (int64_t l = 0; l < x.c.n_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    b.set_scope(fmt::format("layers.{}.", l));
    int n1 = b.emit("rmsnorm", {h, x.param(p + "input_layernorm.weight")}, {{"eps", eps}},
                    {"attn_norm", "attn_rstd"})[0];
    n1 = b.cast(n1, x.cd, "attn_norm_c");
    int q = x.linear(n1, p + "self_attn.q_proj.weight", "q");
    int k = x.linear(n1, p + "self_attn.k_proj.weight", "k");
    int v = x.linear(n1, p + "self_attn.v_proj.weight", "v");
    int a = x.attention(q, k, v, B, T, /*rope=*/true);
    h = b.add(h, x.linear(a, p + "self_attn.o_proj.weight", "attn_out"), "resid_attn");
    int n2 = b.emit("rmsnorm", {h, x.param(p + "post_attention_layernorm.weight")}, {{"eps", eps}},
                    {"mlp_norm", "mlp_rstd"})[0];
    n2 = b.cast(n2, x.cd, "mlp_norm_c");
    // in bf16 the MLP's wide activations are stored in bf16 (half the memory of the saved gate/up)
    int gate = x.linear(n2, p + "mlp.gate_proj.weight", "gate", x.cd);
    int up = x.linear(n2, p + "mlp.up_proj.weight", "up", x.cd);
    int s = b.emit1("swiglu", {gate, up}, {}, "swiglu");
    h = b.add(h, x.linear(s, p + "mlp.down_proj.weight", "mlp_out"), "resid_mlp");
  }
  b.set_scope("");
  int nf = b.emit("rmsnorm", {h, x.param("model.norm.weight")}, {{"eps", eps}},
                  {"final_norm", "final_rstd"})[0];
  return x.linear(nf, "lm_head.weight", "logits");
}

}  // namespace loom::models::detail
