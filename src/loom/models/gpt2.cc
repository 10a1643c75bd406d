// GPT-2: learned positions, LayerNorm with bias, fused qkv projection, GELU (tanh) MLP, output head
// tied to the token embedding. Weights in Conv1D layout (in, out): y = x W + b. Optionally MoE MLPs
// ([model] moe) and NormFormer ([model] normformer: LayerNorm after the attention's output
// projection, a scale per attention head, LayerNorm after GELU).
//   x = wte(tokens) + wpe(positions)                    (B,T,C)
//   per layer: x = x + c_proj(attn(split(c_attn(ln_1(x)))))
//              x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))
//   logits = ln_f(x) wte^T                              (B,T,V)
//
// Tensor-parallel roles: the MLP's c_fc (weight dim 1, bias dim 0) and the attention's c_attn are
// column-parallel, the MLP's and the attention's c_proj (weight dim 0) row-parallel. c_attn's
// output features are [q | k | v], so a contiguous split of them would hand one rank all of q and
// part of k: the weight is held as (C, 3, C) and its bias as (3, C) (files keep Hugging Face's (C,
// 3C) and (3C): ParamInfo::file_shape, the same elements), split by the last dim, each rank's block
// being the q, k and v columns of its heads, as Megatron-LM interleaves them; the forward splits q,
// k and v's weights apart and runs three GEMMs.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/models/architecture.h"
#include "loom/models/layers.h"

namespace loom::models {

namespace {

std::vector<ParamInfo> gpt2_params(const ModelConfig& c) {
  using I = ParamInfo::Init;
  using P = ParamInfo::Parallel;
  const int64_t C = c.d_model, V = c.vocab_size, F = c.ffn();
  std::vector<ParamInfo> p;
  p.push_back({"wte.weight", {V, C}, I::normal, "embed", P::vocab, 0});
  p.push_back({"wpe.weight", {c.max_seq_len, C}, I::normal, "embed"});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::string s = fmt::format("h.{}.", l), blk = fmt::format("layers.{}", l);
    p.push_back({s + "ln_1.weight", {C}, I::ones, blk});
    p.push_back({s + "ln_1.bias", {C}, I::zeros, blk});
    p.push_back(
        {s + "attn.c_attn.weight", {C, 3, C}, I::normal, blk, P::column, 2, false, {C, 3 * C}});
    p.push_back({s + "attn.c_attn.bias", {3, C}, I::zeros, blk, P::column, 1, false, {3 * C}});
    p.push_back({s + "attn.c_proj.weight", {C, C}, I::scaled_normal, blk, P::row, 0});
    p.push_back({s + "attn.c_proj.bias", {C}, I::zeros, blk});
    if (c.normformer) {
      p.push_back({s + "attn.head_scale", {c.n_heads}, I::ones, blk});
      p.push_back({s + "ln_attn.weight", {C}, I::ones, blk});
      p.push_back({s + "ln_attn.bias", {C}, I::zeros, blk});
    }
    p.push_back({s + "ln_2.weight", {C}, I::ones, blk});
    p.push_back({s + "ln_2.bias", {C}, I::zeros, blk});
    if (c.moe.layer(l)) {
      // Conv1D layout like the rest of GPT-2: the router (C,E), each expert's (in, out) stacked;
      // the experts have no biases (a bias would make the empty slots nonzero)
      const int64_t E = c.moe.experts;
      p.push_back({s + "mlp.gate.weight", {C, E}, I::normal, blk});
      p.push_back({s + "mlp.experts.c_fc.weight", {E, C, F}, I::normal, blk, P::none, -1, true});
      p.push_back(
          {s + "mlp.experts.c_proj.weight", {E, F, C}, I::scaled_normal, blk, P::none, -1, true});
      if (c.normformer) {
        p.push_back({s + "mlp.experts.ln_fc.weight", {F}, I::ones, blk});
        p.push_back({s + "mlp.experts.ln_fc.bias", {F}, I::zeros, blk});
      }
      continue;
    }
    p.push_back({s + "mlp.c_fc.weight", {C, F}, I::normal, blk, P::column, 1});
    p.push_back({s + "mlp.c_fc.bias", {F}, I::zeros, blk, P::column, 0});
    if (c.normformer) {
      p.push_back({s + "mlp.ln_fc.weight", {F}, I::ones, blk});
      p.push_back({s + "mlp.ln_fc.bias", {F}, I::zeros, blk});
    }
    p.push_back({s + "mlp.c_proj.weight", {F, C}, I::scaled_normal, blk, P::row, 0});
    p.push_back({s + "mlp.c_proj.bias", {C}, I::zeros, blk});
  }
  p.push_back({"ln_f.weight", {C}, I::ones, "head"});
  p.push_back({"ln_f.bias", {C}, I::zeros, "head"});
  return p;
}

int build_gpt2(ops::Builder& b, const ModelConfig& c, const ForwardInputs& in) {
  detail::Ctx x{b, c, in};
  const double eps = x.c.norm_eps;
  const int64_t C = x.c.d_model;
  int pos = b.emit1(ir::Op::embedding, {x.positions(), x.param("wpe.weight")}, {}, "pos_embed");
  int h = b.add(b.emit1(ir::Op::embedding, {in.tokens, x.param("wte.weight")}, {}, "tok_embed"),
                pos, "embed");
  auto ln = [&](int in, const std::string& p, const std::string& name) {
    return b.emit(ir::Op::layernorm, {in, x.param(p + ".weight"), x.param(p + ".bias")},
                  {{"eps", eps}}, {name, name + "_mean", name + "_rstd"})[0];
  };
  auto affine = [&](int in, const std::string& p, const std::string& name) {
    return b.add(x.conv1d(in, p + ".weight", name + "_mm"), x.param(p + ".bias"), name);
  };
  for (int64_t l = 0; l < x.c.n_layers; ++l) {
    std::string p = fmt::format("h.{}.", l);
    b.set_scope(fmt::format("h.{}.", l));
    const int n1 = b.cast(ln(h, p + "ln_1", "ln_1"), x.cd);
    // cast whole, then split: the gathered weight is only cast (gather_cast gathers it in bf16)
    const auto ws = b.emit(ir::Op::split, {x.weight(x.param(p + "attn.c_attn.weight"))},
                           {{"sizes", std::vector<int64_t>{1, 1, 1}}, {"axis", int64_t(1)}},
                           {"wq3", "wk3", "wv3"});
    const auto bs = b.emit(ir::Op::split, {x.param(p + "attn.c_attn.bias")},
                           {{"sizes", std::vector<int64_t>{1, 1, 1}}, {"axis", int64_t(0)}},
                           {"bq2", "bk2", "bv2"});
    int qkv[3];
    for (int i = 0; i < 3; ++i) {
      const char* name = i == 0 ? "q" : i == 1 ? "k" : "v";
      const int w = b.reshape(ws[size_t(i)], {C, C}, std::string("w") + name);
      const int bias = b.reshape(bs[size_t(i)], {C}, std::string("b") + name);
      qkv[i] = b.add(b.matmul(n1, w, false, false, std::string(name) + "_mm"), bias, name);
    }
    int a = x.attention(qkv[0], qkv[1], qkv[2], /*rope=*/false);
    if (c.normformer) {
      int w = x.head_scaled(p + "attn.c_proj.weight", p + "attn.head_scale", true);
      int o = b.add(b.matmul(b.cast(a, x.cd), x.weight(w), false, false, "attn_out_mm"),
                    x.param(p + "attn.c_proj.bias"), "attn_out");
      h = b.add(h, ln(o, p + "ln_attn", "ln_attn"), "resid_attn");
    } else {
      h = b.add(h, affine(a, p + "attn.c_proj", "attn_out"), "resid_attn");
    }
    if (c.moe.layer(l)) {
      int n2 = ln(h, p + "ln_2", "ln_2");
      int logits = b.matmul(n2, x.param(p + "mlp.gate.weight"), false, false, "router_logits");
      int y = x.moe(n2, logits, [&](int xe) {
        int f = b.emit1(ir::Op::gelu,
                        {x.experts_mm(xe, p + "mlp.experts.c_fc.weight", false, "expert_fc")}, {},
                        "expert_gelu");
        if (c.normformer) f = ln(f, p + "mlp.experts.ln_fc", "expert_ln_fc");
        return x.experts_mm(f, p + "mlp.experts.c_proj.weight", false, "expert_proj");
      });
      h = b.add(h, y, "resid_mlp");
      continue;
    }
    int f = b.emit1(ir::Op::gelu, {affine(ln(h, p + "ln_2", "ln_2"), p + "mlp.c_fc", "fc")}, {},
                    "gelu");
    if (c.normformer) f = ln(f, p + "mlp.ln_fc", "ln_fc");
    h = b.add(h, affine(f, p + "mlp.c_proj", "mlp_out"), "resid_mlp");
  }
  b.set_scope("");
  int nf = ln(x.head_rows(h), "ln_f", "ln_f");
  return b.matmul(b.cast(nf, x.cd), x.weight(x.param("wte.weight")), false, true, "logits");
}

// transformers' GPT2Config. What is left out takes HF's default, which matches Loom (attention
// scaled by 1/sqrt(head size)); dropout defaults are irrelevant at inference.
nlohmann::ordered_json gpt2_hf_config(const ModelConfig& m) {
  if (m.moe.enabled() || m.normformer)
    throw Error("this model has no Hugging Face equivalent: GPT-2 with " +
                    std::string(m.moe.enabled() ? "MoE layers" : "NormFormer"),
                "transformers' GPT2LMHeadModel is dense and has no NormFormer norms");
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab_size},
          {"n_embd", m.d_model},
          {"n_layer", m.n_layers},
          {"n_head", m.n_heads},
          {"n_positions", m.max_seq_len},
          {"n_inner", m.ffn()},
          {"layer_norm_epsilon", m.norm_eps},
          {"activation_function", "gelu_new"},  // GELU, tanh approximation
          {"tie_word_embeddings", true},        // the logits are ln_f(x) @ wte^T
          {"torch_dtype", "float32"}};
}

// transformers' GPT2Config -> [model]. Defaults are GPT2Config's where a field is absent.
ModelConfig gpt2_from_hf(HfConfigReader& r) {
  ModelConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("n_embd");
  c.n_layers = r.integer("n_layer");
  c.n_heads = r.integer("n_head");
  c.max_seq_len = r.integer("n_positions", 1024);
  c.ffn_hidden = r.integer("n_inner", 0);  // null: 4 n_embd, Loom's default too
  c.norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = true;
  r.require("tie_word_embeddings", {true}, "Loom's GPT-2 head is the token embedding");
  r.require("activation_function", {"gelu_new", "gelu_pytorch_tanh"},
            "Loom's GPT-2 MLP is GELU with the tanh approximation");
  r.require("scale_attn_weights", {true}, "Loom scales attention scores by 1/sqrt(head size)");
  r.require("scale_attn_by_inverse_layer_idx", {false}, "Loom does not scale by layer index");
  r.require("add_cross_attention", {false}, "Loom's GPT-2 is decoder-only");
  // Dropout: Loom trains without it (a fine-tune from a GPT-2 that had it sees none); the
  // summary_* fields configure a classification head Loom does not build; reorder_and_upcast_attn
  // only changes fp16 rounding.
  r.ignore({"attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_activation",
            "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj",
            "n_ctx", "reorder_and_upcast_attn", "task_specific_params"});
  r.ignore_common();
  return c;
}

}  // namespace

void register_gpt2() {
  register_architecture({.name = "gpt2",
                         .hf_class = "GPT2LMHeadModel",
                         .validate =
                             [](const ModelConfig& c, const auto& bad) {
                               if (c.n_kv_heads != 0 && c.n_kv_heads != c.n_heads)
                                 bad("n_kv_heads", "gpt2 has no grouped-query attention");
                             },
                         .default_ffn = [](const ModelConfig& c) { return 4 * c.d_model; },
                         .params = gpt2_params,
                         .build = build_gpt2,
                         .train_flops_per_token =
                             [](const ModelConfig& c, int64_t T) {
                               double matmul =
                                   double(c.vocab_size * c.d_model);  // the head, tied to wte
                               for (const auto& p : gpt2_params(c))
                                 if (p.shape.size() >= 2 && !p.expert && p.block != "embed")
                                   matmul += double(numel(p.shape));
                               matmul += active_expert_params(c, gpt2_params(c));
                               return palm_train_flops(matmul, c, T);
                             },
                         .hf_config = gpt2_hf_config,
                         .hf_model_type = "gpt2",
                         .from_hf = gpt2_from_hf});
}

}  // namespace loom::models
