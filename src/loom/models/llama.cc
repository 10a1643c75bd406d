// Llama: RMSNorm, RoPE (rotate-half), grouped-query attention, SwiGLU MLP, an output head of its
// own or (tie_embeddings) the token embedding. Optionally Mixtral's MoE MLPs ([model] moe) and
// NormFormer's norms ([model] normformer: RMSNorm after the attention's output projection, a scale
// per attention head, RMSNorm after SwiGLU).
//   x = embed(tokens)                                   (B,T,C)
//   per layer: h = x + o_proj(attn(rope(q), rope(k), v)) of rmsnorm(x)
//              x = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = rmsnorm(h)
//   logits = lm_head(rmsnorm(x))                         (B,T,V)
//
// Weights are nn.Linear's (out, in): q/k/v and gate/up are column-parallel on dim 0, o and down
// row-parallel on dim 1.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/models/architecture.h"
#include "loom/models/layers.h"

namespace loom::models {

namespace {

std::vector<ParamInfo> llama_params(const ModelConfig& c) {
  using I = ParamInfo::Init;
  using P = ParamInfo::Parallel;
  const int64_t C = c.d_model, V = c.vocab_size, F = c.ffn(), HS = c.head_size();
  std::vector<ParamInfo> p;
  p.push_back({"model.embed_tokens.weight", {V, C}, I::normal, "embed", P::vocab, 0});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::string s = fmt::format("model.layers.{}.", l), blk = fmt::format("layers.{}", l);
    p.push_back({s + "input_layernorm.weight", {C}, I::ones, blk});
    p.push_back({s + "self_attn.q_proj.weight", {c.n_heads * HS, C}, I::normal, blk, P::column, 0});
    p.push_back(
        {s + "self_attn.k_proj.weight", {c.kv_heads() * HS, C}, I::normal, blk, P::column, 0});
    p.push_back(
        {s + "self_attn.v_proj.weight", {c.kv_heads() * HS, C}, I::normal, blk, P::column, 0});
    p.push_back(
        {s + "self_attn.o_proj.weight", {C, c.n_heads * HS}, I::scaled_normal, blk, P::row, 1});
    if (c.normformer) {
      p.push_back({s + "self_attn.head_scale", {c.n_heads}, I::ones, blk});
      p.push_back({s + "attn_out_layernorm.weight", {C}, I::ones, blk});
    }
    p.push_back({s + "post_attention_layernorm.weight", {C}, I::ones, blk});
    if (c.moe.layer(l)) {
      // Mixtral's block_sparse_moe: w1 gate, w3 up, w2 down; each expert's (out, in) stacked
      const int64_t E = c.moe.experts;
      const std::string m = s + "block_sparse_moe.";
      p.push_back({m + "gate.weight", {E, C}, I::normal, blk});
      p.push_back({m + "experts.w1.weight", {E, F, C}, I::normal, blk, P::none, -1, true});
      p.push_back({m + "experts.w2.weight", {E, C, F}, I::scaled_normal, blk, P::none, -1, true});
      p.push_back({m + "experts.w3.weight", {E, F, C}, I::normal, blk, P::none, -1, true});
      if (c.normformer) p.push_back({m + "experts.ffn_layernorm.weight", {F}, I::ones, blk});
      continue;
    }
    p.push_back({s + "mlp.gate_proj.weight", {F, C}, I::normal, blk, P::column, 0});
    p.push_back({s + "mlp.up_proj.weight", {F, C}, I::normal, blk, P::column, 0});
    if (c.normformer) p.push_back({s + "mlp.ffn_layernorm.weight", {F}, I::ones, blk});
    p.push_back({s + "mlp.down_proj.weight", {C, F}, I::scaled_normal, blk, P::row, 1});
  }
  p.push_back({"model.norm.weight", {C}, I::ones, "head"});
  if (!c.tie_embeddings) p.push_back({"lm_head.weight", {V, C}, I::normal, "head", P::vocab, 0});
  return p;
}

int build_llama(ops::Builder& b, const ModelConfig& c, const ForwardInputs& in) {
  detail::Ctx x{b, c, in};
  const double eps = x.c.norm_eps;
  // NormFormer's extra norms, RMSNorm in Llama's flavour; on f32 (a bf16 input is widened)
  auto norm = [&](int v, const std::string& w, const std::string& name) {
    return b.emit(ir::Op::rmsnorm, {b.cast(v, DType::f32), x.param(w)}, {{"eps", eps}},
                  {name, name + "_rstd"})[0];
  };
  int h =
      b.emit1(ir::Op::embedding, {in.tokens, x.param("model.embed_tokens.weight")}, {}, "embed");
  for (int64_t l = 0; l < x.c.n_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    b.set_scope(fmt::format("layers.{}.", l));
    int n1 = b.emit(ir::Op::rmsnorm, {h, x.param(p + "input_layernorm.weight")}, {{"eps", eps}},
                    {"attn_norm", "attn_rstd"})[0];
    n1 = b.cast(n1, x.cd, "attn_norm_c");
    int q = x.linear(n1, p + "self_attn.q_proj.weight", "q");
    int k = x.linear(n1, p + "self_attn.k_proj.weight", "k");
    int v = x.linear(n1, p + "self_attn.v_proj.weight", "v");
    int a = x.attention(q, k, v, /*rope=*/true);
    if (c.normformer) {
      int wo = x.head_scaled(p + "self_attn.o_proj.weight", p + "self_attn.head_scale", false);
      int o = norm(x.linear(a, wo, "attn_out"), p + "attn_out_layernorm.weight", "attn_out_norm");
      h = b.add(h, o, "resid_attn");
    } else {
      h = b.add(h, x.linear(a, p + "self_attn.o_proj.weight", "attn_out"), "resid_attn");
    }
    int n2 = b.emit(ir::Op::rmsnorm, {h, x.param(p + "post_attention_layernorm.weight")},
                    {{"eps", eps}}, {"mlp_norm", "mlp_rstd"})[0];
    if (c.moe.layer(l)) {
      const std::string m = p + "block_sparse_moe.experts.";
      int logits =
          b.matmul(n2, x.param(p + "block_sparse_moe.gate.weight"), false, true, "router_logits");
      int y = x.moe(n2, logits, [&](int xe) {
        int gate = x.experts_mm(xe, m + "w1.weight", true, "expert_gate", x.cd);
        int up = x.experts_mm(xe, m + "w3.weight", true, "expert_up", x.cd);
        int s = b.emit1(ir::Op::swiglu, {gate, up}, {}, "expert_swiglu");
        if (c.normformer) s = norm(s, m + "ffn_layernorm.weight", "expert_ffn_norm");
        return x.experts_mm(s, m + "w2.weight", true, "expert_down");
      });
      h = b.add(h, y, "resid_mlp");
      continue;
    }
    n2 = b.cast(n2, x.cd, "mlp_norm_c");
    // in bf16 the MLP's wide activations are stored in bf16 (half the memory of the saved gate/up)
    int gate = x.linear(n2, p + "mlp.gate_proj.weight", "gate", x.cd);
    int up = x.linear(n2, p + "mlp.up_proj.weight", "up", x.cd);
    int s = b.emit1(ir::Op::swiglu, {gate, up}, {}, "swiglu");
    if (c.normformer) s = norm(s, p + "mlp.ffn_layernorm.weight", "ffn_norm");
    h = b.add(h, x.linear(s, p + "mlp.down_proj.weight", "mlp_out"), "resid_mlp");
  }
  b.set_scope("");
  h = x.head_rows(h);
  int nf = b.emit(ir::Op::rmsnorm, {h, x.param("model.norm.weight")}, {{"eps", eps}},
                  {"final_norm", "final_rstd"})[0];
  if (!c.tie_embeddings) return x.linear(nf, "lm_head.weight", "logits");
  // tied: logits = nf E^T with the embedding (V, C) as the head, as nn.Linear would hold it
  return x.linear(nf, "model.embed_tokens.weight", "logits");
}

// transformers' LlamaConfig. What is left out takes HF's default, which matches Loom (no attention
// or MLP biases).
nlohmann::ordered_json llama_hf_config(const ModelConfig& m) {
  // a dense NormFormer would load into LlamaForCausalLM without its norms (unexpected keys,
  // dropped): another model than the one trained
  if (m.normformer && !m.moe.enabled())
    throw Error("this model has no Hugging Face equivalent: Llama with [model] normformer = true",
                "transformers' LlamaForCausalLM has no NormFormer norms");
  nlohmann::ordered_json j = {{"architectures", {"LlamaForCausalLM"}},
                              {"model_type", "llama"},
                              {"vocab_size", m.vocab_size},
                              {"hidden_size", m.d_model},
                              {"intermediate_size", m.ffn()},
                              {"num_hidden_layers", m.n_layers},
                              {"num_attention_heads", m.n_heads},
                              {"num_key_value_heads", m.kv_heads()},
                              {"max_position_embeddings", m.max_seq_len},
                              {"rms_norm_eps", m.norm_eps},
                              {"rope_theta", m.rope_theta},
                              {"hidden_act", "silu"},
                              {"tie_word_embeddings", m.tie_embeddings},
                              {"torch_dtype", "float32"}};
  if (!m.moe.enabled()) return j;
  // An MoE Llama is transformers' MixtralConfig when every layer is MoE: Mixtral is Llama's
  // attention with block_sparse_moe MLPs (softmax router, top-k gates renormalised, SwiGLU experts
  // w1/w3/w2), intermediate_size each expert's width. Mixtral routes without capacity: a model
  // trained with drops runs dropless there (as Loom's own decoding does).
  auto refuse = [](const std::string& why) {
    throw Error("this model has no Mixtral equivalent: " + why,
                "transformers' MixtralForCausalLM has an MoE MLP in every layer and no NormFormer");
  };
  if (m.moe.every != 1) refuse(fmt::format("[model] moe every = {} (Mixtral: 1)", m.moe.every));
  if (m.normformer) refuse("[model] normformer = true");
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j["num_local_experts"] = m.moe.experts;
  j["num_experts_per_tok"] = m.moe.top_k;
  j["router_aux_loss_coef"] = m.moe.aux_loss;
  j["output_router_logits"] = false;
  j["sliding_window"] = nullptr;
  j["attention_dropout"] = 0.0;
  return j;
}

// transformers' LlamaConfig -> [model]. Defaults are LlamaConfig's where a field is absent.
ModelConfig llama_from_hf(HfConfigReader& r) {
  ModelConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("hidden_size");
  c.ffn_hidden = r.integer("intermediate_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
  c.max_seq_len = r.integer("max_position_embeddings", 2048);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.tie_embeddings = r.boolean("tie_word_embeddings", false);
  // RoPE: transformers 5 writes rope_parameters {rope_type, rope_theta}; older ones rope_theta and
  // rope_scaling beside it. Loom has the default (unscaled) rotary embedding only.
  c.rope_theta = r.number("rope_theta", 10000.0);
  r.require("rope_scaling", {nullptr}, "Loom has no rope scaling (only the default RoPE)");
  if (r.has("rope_parameters")) {
    HfConfigReader rp = r.nested("rope_parameters");
    rp.require("rope_type", {"default"},
               "Loom has only the default RoPE (no linear, dynamic, yarn or llama3 scaling)");
    c.rope_theta = rp.number("rope_theta", c.rope_theta);
    rp.finish();
  }
  r.require("rope_interleaved", {false}, "Loom's RoPE rotates halves (Hugging Face's layout)");
  r.require("hidden_act", {"silu"}, "Loom's Llama MLP is SwiGLU (silu)");
  r.require("attention_bias", {false}, "Loom's Llama attention has no biases");
  r.require("mlp_bias", {false}, "Loom's Llama MLP has no biases");
  r.require("pretraining_tp", {1}, "Loom has no tensor-parallel-emulating matmul split");
  r.require("head_dim", {c.n_heads > 0 ? c.d_model / c.n_heads : 0},
            "Loom's head size is hidden_size / num_attention_heads");
  // Loom trains without dropout; a nonzero attention dropout would change the training step
  r.require("attention_dropout", {0.0}, "Loom has no attention dropout");
  r.ignore_common();
  return c;
}

}  // namespace

void register_llama() {
  register_architecture(
      {.name = "llama",
       .hf_class = "LlamaForCausalLM",
       .validate =
           [](const ModelConfig& c, const auto& bad) {
             if (c.head_size() % 2) bad("n_heads", "head size d_model/n_heads must be even (RoPE)");
           },
       .default_ffn = [](const ModelConfig& c) { return (8 * c.d_model / 3 + 15) / 16 * 16; },
       .params = llama_params,
       .build = build_llama,
       .train_flops_per_token =
           [](const ModelConfig& c, int64_t T) {
             double matmul = 0;  // every 2-d weight but the embedding (a lookup) ...
             for (const auto& p : llama_params(c))
               if (p.shape.size() == 2 && p.block != "embed") matmul += double(numel(p.shape));
             matmul += active_expert_params(c, llama_params(c));
             // ... unless it is also the head
             if (c.tie_embeddings) matmul += double(c.vocab_size * c.d_model);
             return palm_train_flops(matmul, c, T);
           },
       .hf_config = llama_hf_config,
       .hf_model_type = "llama",
       .from_hf = llama_from_hf});
}

}  // namespace loom::models
