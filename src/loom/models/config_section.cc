#include "loom/models/config_section.h"

#include "loom/config/schema.h"
#include "loom/models/architecture.h"

namespace loom::models {

namespace {

using namespace config;
using L = ModelLimits;

// moe = { experts = 8, top_k = 2, ... }
std::vector<Key<MoeConfig>> moe_keys() {
  using M = MoeConfig;
  return {
      int_key("experts", &M::experts, closed(0, L::experts),
              "the number of experts (0: a dense model)"),
      int_key("top_k", &M::top_k, at_least(1), "experts per token, at most `experts`"),
      int_key("every", &M::every, at_least(1), "every `every`-th layer is MoE; at most `n_layers`"),
      float_key("capacity_factor", &M::capacity_factor, above(0),
                "slots per expert and sequence: ceil(factor T k / E)", config::Used::f64),
      bool_key("dropless", &M::dropless, "capacity T: no token dropped"),
      float_key("aux_loss", &M::aux_loss, at_least(0), "the load-balancing loss's weight"),
      float_key("z_loss", &M::z_loss, at_least(0), "the router z-loss's weight"),
      string_choice_key("balance", &M::balance, {"model", "layer"},
                        "over all MoE layers' tokens together, or per layer"),
  };
}

}  // namespace

const Section<ModelConfig>& model_section() {
  using C = ModelConfig;
  static const Section<C> s{
      "model",
      {
          string_key("arch", &C::arch, config::choice_list(architecture_names(), true), "required"),
          int_key("vocab_size", &C::vocab_size, closed(1, L::vocab_size),
                  ">= 256 for byte-level text"),
          int_key("d_model", &C::d_model, closed(1, L::d_model), "a multiple of n_heads"),
          int_key("n_layers", &C::n_layers, closed(1, L::n_layers),
                  "deeper graphs cost the memory planner minutes"),
          int_key("n_heads", &C::n_heads, at_least(1), "divides d_model"),
          int_key("n_kv_heads", &C::n_kv_heads, at_least(0),
                  "divides n_heads (Llama's grouped-query attention; GPT-2 has none)",
                  "0 (= n_heads)"),
          int_key("ffn_hidden", &C::ffn_hidden, closed(0, L::ffn_hidden), "the MLP's width",
                  "0 (Llama: 8/3 d rounded up to 16; GPT-2: 4 d)"),
          int_key("max_seq_len", &C::max_seq_len, closed(1, L::max_seq_len),
                  "at least `[train] seq_len`"),
          // past 1 the norm divides by about sqrt(eps), not the scale (3e38 trained nothing)
          float_key("norm_eps", &C::norm_eps, {0, 1, true, false}, ""),
          float_key("rope_theta", &C::rope_theta, above(0), "Llama's rotary base"),
          bool_key("tie_embeddings", &C::tie_embeddings,
                   "the head reuses the token embedding (Llama; GPT-2's is always tied)"),
          choice_key<C>(
              "dtype", {"f32", "bf16"},
              [](C& c, size_t i) { parse_dtype(i == 0 ? "f32" : "bf16", &c.dtype); }, "f32",
              "compute; weights and moments stay f32"),
          bool_key("normformer", &C::normformer,
                   "NormFormer's post-attention norm, head scales and post-activation norm"),
          table_key("moe", &C::moe, moe_keys(), "{ experts = ..., top_k = ..., ... }",
                    "none (dense)", "Mixture-of-Experts MLPs: the `moe.` keys"),
      },
      nullptr};
  return s;
}

}  // namespace loom::models
