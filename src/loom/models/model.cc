#include "loom/models/model.h"

#include <fmt/format.h>

#include "loom/core/error.h"

namespace loom::models {

int64_t ModelConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (arch == "gpt2") return 4 * d_model;
  int64_t h = 8 * d_model / 3;
  return (h + 15) / 16 * 16;
}

void ModelConfig::validate(const std::string& src) const {
  auto bad = [&](const std::string& key, const std::string& why) {
    throw Error(fmt::format("{}: [model] {}: {}", src, key, why));
  };
  if (arch != "llama" && arch != "gpt2") bad("arch", "must be \"llama\" or \"gpt2\", got \"" + arch + "\"");
  if (vocab_size <= 0) bad("vocab_size", "must be > 0");
  if (vocab_size > (int64_t(1) << 31) - 1) bad("vocab_size", "must fit in i32");
  if (d_model <= 0) bad("d_model", "must be > 0");
  if (n_layers <= 0) bad("n_layers", "must be > 0");
  if (n_heads <= 0) bad("n_heads", "must be > 0");
  if (d_model % n_heads) bad("n_heads", fmt::format("must divide d_model = {}", d_model));
  if (arch == "llama" && head_size() % 2) bad("n_heads", "head size d_model/n_heads must be even (RoPE)");
  if (n_kv_heads < 0 || n_heads % kv_heads())
    bad("n_kv_heads", fmt::format("must divide n_heads = {}", n_heads));
  if (arch == "gpt2" && n_kv_heads != 0 && n_kv_heads != n_heads)
    bad("n_kv_heads", "gpt2 has no grouped-query attention");
  if (ffn_hidden < 0) bad("ffn_hidden", "must be >= 0");
  if (max_seq_len <= 0) bad("max_seq_len", "must be > 0");
  if (!(norm_eps > 0)) bad("norm_eps", "must be > 0");
  if (!(rope_theta > 0)) bad("rope_theta", "must be > 0");
}

std::vector<ParamInfo> param_infos(const ModelConfig& c) {
  using I = ParamInfo::Init;
  const int64_t C = c.d_model, V = c.vocab_size, F = c.ffn(), HS = c.head_size();
  std::vector<ParamInfo> p;
  if (c.arch == "llama") {
    p.push_back({"model.embed_tokens.weight", {V, C}});
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::string s = fmt::format("model.layers.{}.", l);
      p.push_back({s + "input_layernorm.weight", {C}, I::ones});
      p.push_back({s + "self_attn.q_proj.weight", {c.n_heads * HS, C}});
      p.push_back({s + "self_attn.k_proj.weight", {c.kv_heads() * HS, C}});
      p.push_back({s + "self_attn.v_proj.weight", {c.kv_heads() * HS, C}});
      p.push_back({s + "self_attn.o_proj.weight", {C, c.n_heads * HS}, I::scaled_normal});
      p.push_back({s + "post_attention_layernorm.weight", {C}, I::ones});
      p.push_back({s + "mlp.gate_proj.weight", {F, C}});
      p.push_back({s + "mlp.up_proj.weight", {F, C}});
      p.push_back({s + "mlp.down_proj.weight", {C, F}, I::scaled_normal});
    }
    p.push_back({"model.norm.weight", {C}, I::ones});
    p.push_back({"lm_head.weight", {V, C}});
  } else {
    p.push_back({"wte.weight", {V, C}});
    p.push_back({"wpe.weight", {c.max_seq_len, C}});
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::string s = fmt::format("h.{}.", l);
      p.push_back({s + "ln_1.weight", {C}, I::ones});
      p.push_back({s + "ln_1.bias", {C}, I::zeros});
      p.push_back({s + "attn.c_attn.weight", {C, 3 * C}});
      p.push_back({s + "attn.c_attn.bias", {3 * C}, I::zeros});
      p.push_back({s + "attn.c_proj.weight", {C, C}, I::scaled_normal});
      p.push_back({s + "attn.c_proj.bias", {C}, I::zeros});
      p.push_back({s + "ln_2.weight", {C}, I::ones});
      p.push_back({s + "ln_2.bias", {C}, I::zeros});
      p.push_back({s + "mlp.c_fc.weight", {C, F}});
      p.push_back({s + "mlp.c_fc.bias", {F}, I::zeros});
      p.push_back({s + "mlp.c_proj.weight", {F, C}, I::scaled_normal});
      p.push_back({s + "mlp.c_proj.bias", {C}, I::zeros});
    }
    p.push_back({"ln_f.weight", {C}, I::ones});
    p.push_back({"ln_f.bias", {C}, I::zeros});
  }
  return p;
}

int64_t param_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& p : param_infos(c)) n += numel(p.shape);
  return n;
}

double train_flops_per_token(const ModelConfig& c, int64_t T) {
  double matmul_params = 0;
  for (const auto& p : param_infos(c))
    if (p.shape.size() == 2 && p.name != "model.embed_tokens.weight" && p.name != "wpe.weight" &&
        p.name != "wte.weight")
      matmul_params += double(numel(p.shape));
  if (c.arch == "gpt2") matmul_params += double(c.vocab_size * c.d_model);  // tied output head
  return 6.0 * matmul_params + 12.0 * double(c.n_layers) * double(T) * double(c.d_model);
}

}  // namespace loom::models

#include "loom/models/layers.h"

namespace loom::models {

ModelGraph build_model(const ModelConfig& c, int64_t B, int64_t T) {
  c.validate("<model>");
  if (T > c.max_seq_len)
    throw Error(fmt::format("sequence length {} exceeds [model] max_seq_len = {}", T, c.max_seq_len));
  ModelGraph m;
  m.graph = ir::Graph(c.arch);
  ir::Graph& g = m.graph;
  for (const auto& p : param_infos(c)) g.add_input(p.name, {DType::f32, p.shape}, ir::ValueKind::param);
  m.tokens = g.add_input("tokens", {DType::i32, {B, T}}, ir::ValueKind::input);
  m.targets = g.add_input("targets", {DType::i32, {B, T}}, ir::ValueKind::input);
  ops::Builder b(g);
  detail::Ctx x{b, c, c.dtype};
  m.logits = c.arch == "llama" ? detail::build_llama(x, m.tokens, B, T)
                               : detail::build_gpt2(x, m.tokens, B, T);
  auto ce = b.emit("cross_entropy", {m.logits, m.targets}, {}, {"loss", "dlogits"});
  m.loss = ce[0];
  return m;
}

}  // namespace loom::models
