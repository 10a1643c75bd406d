// GPT-2: learned positions, LayerNorm with bias, fused qkv projection, GELU (tanh) MLP, output head
// tied to the token embedding. Weights in Conv1D layout (in, out): y = x W + b.
//   x = wte(tokens) + wpe(positions)                    (B,T,C)
//   per layer: x = x + c_proj(attn(split(c_attn(ln_1(x)))))
//              x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))
//   logits = ln_f(x) wte^T                              (B,T,V)
#include <fmt/format.h>

#include "loom/models/layers.h"

namespace loom::models::detail {

int build_gpt2(Ctx& x, int tokens, int64_t B, int64_t T) {
  ops::Builder& b = x.b;
  const double eps = x.c.norm_eps;
  const int64_t C = x.c.d_model;
  int pos = b.emit1("positions", {}, {{"shape", Shape{B, T}}}, "positions");
  int h = b.add(b.emit1("embedding", {tokens, x.param("wte.weight")}, {}, "tok_embed"),
                b.emit1("embedding", {pos, x.param("wpe.weight")}, {}, "pos_embed"), "embed");
  auto ln = [&](int in, const std::string& p, const std::string& name) {
    return b.emit("layernorm", {in, x.param(p + ".weight"), x.param(p + ".bias")}, {{"eps", eps}},
                  {name, name + "_mean", name + "_rstd"})[0];
  };
  auto affine = [&](int in, const std::string& p, const std::string& name) {
    return b.add(x.conv1d(in, p + ".weight", name + "_mm"), x.param(p + ".bias"), name);
  };
  for (int64_t l = 0; l < x.c.n_layers; ++l) {
    std::string p = fmt::format("h.{}.", l);
    b.set_scope(fmt::format("h.{}.", l));
    int qkv = affine(ln(h, p + "ln_1", "ln_1"), p + "attn.c_attn", "qkv");
    auto parts = b.emit("split", {qkv}, {{"sizes", std::vector<int64_t>{C, C, C}}}, {"q", "k", "v"});
    int a = x.attention(parts[0], parts[1], parts[2], B, T, /*rope=*/false);
    h = b.add(h, affine(a, p + "attn.c_proj", "attn_out"), "resid_attn");
    int f = b.emit1("gelu", {affine(ln(h, p + "ln_2", "ln_2"), p + "mlp.c_fc", "fc")}, {}, "gelu");
    h = b.add(h, affine(f, p + "mlp.c_proj", "mlp_out"), "resid_mlp");
  }
  b.set_scope("");
  int nf = ln(h, "ln_f", "ln_f");
  return b.matmul(b.cast(nf, x.cd), b.cast(x.param("wte.weight"), x.cd), false, true, "logits");
}

}  // namespace loom::models::detail
