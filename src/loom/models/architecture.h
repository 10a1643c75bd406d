// Architectures: each model family (Llama, GPT-2, ...) is one registered definition in a file of
// its own (models/llama.cc, models/gpt2.cc), holding everything Loom knows about it: its config
// checks, its parameters (declared once, with shape, initialiser, block and tensor-parallel role),
// its graph, its FLOPs per token and its Hugging Face config. Code outside models/ asks this table
// instead of comparing `arch` strings.
//
// Not here: sharding (a parameter's role says what it is, tactics decide how to split it), devices.
// Invariant: `params` lists every parameter `build` reads, in a fixed order, each in exactly one
// block.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "loom/models/hf_config.h"
#include "loom/models/model.h"

namespace loom::ops {
class Builder;
}

namespace loom::models {

// What an architecture's build reads besides its params: B sequences of T tokens and, when
// decoding incrementally (model.h: build_decode), the position of the first of them and the length
// of the key/value caches the attention keeps.
// What a Mixture-of-Experts layer's router reports, for the auxiliary losses and the load metrics
// (ops/moe.cc: moe_router's outputs 3..6).
struct MoeLayerStats {
  int prob_sum = -1, z_sum = -1, routed = -1, kept = -1;
};

struct ForwardInputs {
  int tokens = -1;  // i32 (B,T)
  int64_t B = 0, T = 0;
  int start = -1;  // decoding: i32[], the first token's position; -1: a full forward from 0
  int64_t cache_len = 0;
  std::vector<MoeLayerStats>* moe = nullptr;  // where MoE layers report (null: not collected)
  // Decoding under a compute dtype other than f32: where weights read in that dtype are declared
  // as copies (ModelGraph::weight_copies); null: each weight's f32 master is cast where it is read.
  std::map<int, std::string>* weight_copies = nullptr;
  bool decoding() const { return start >= 0; }
};

struct Architecture {
  std::string name;      // [model] arch
  std::string hf_class;  // Hugging Face's model class: "LlamaForCausalLM"
  // Checks only this architecture can make (the common ones are in ModelConfig::validate); throws
  // loom::Error through `bad(key, why)`.
  std::function<void(const ModelConfig&,
                     const std::function<void(const std::string&, const std::string&)>& bad)>
      validate;
  std::function<int64_t(const ModelConfig&)> default_ffn;  // [model] ffn_hidden = 0
  std::function<std::vector<ParamInfo>(const ModelConfig&)> params;
  // Emits the forward graph over `in.tokens` (i32 (B,T)) into b's graph, whose params are already
  // declared; returns the logits (B,T,V), or (B,1,V) of the last token when decoding. Written
  // against detail::Ctx (layers.h), whose positions, attention and head rows follow `in`.
  std::function<int(ops::Builder& b, const ModelConfig&, const ForwardInputs& in)> build;
  // Training FLOPs per token (forward + backward) at sequence length T.
  std::function<double(const ModelConfig&, int64_t T)> train_flops_per_token;
  // transformers' config.json for this model ...
  std::function<nlohmann::ordered_json(const ModelConfig&)> hf_config;
  // ... and back: its "model_type", and the [model] a config.json describes (arch is set by the
  // caller). Reads through `r`, claiming every field (hf_config.h); a field whose value Loom cannot
  // build is an error naming it.
  std::string hf_model_type;
  std::function<ModelConfig(HfConfigReader& r)> from_hf;
};

// The model a transformers config.json describes, by its "model_type"; `file` names it in errors.
// Every field must be claimed by the architecture's from_hf (an unknown one is an error), and the
// result passes ModelConfig::validate.
ModelConfig model_from_hf(const nlohmann::json& config, const std::string& file);

// Throws loom::Error naming the known architectures for an unknown name.
const Architecture& architecture(std::string_view name);
bool has_architecture(std::string_view name);
std::vector<std::string> architecture_names();

// Registration, called once from the table (explicit, so static linking never drops one).
void register_architecture(Architecture a);
void register_llama();
void register_gpt2();

// PaLM's appendix-B count shared by the decoder-only models: 6 FLOPs per matmul weight per token
// (forward 2, backward 4) plus 12 * L * T * d_model for attention scores and values (full T*T).
double palm_train_flops(double matmul_params, const ModelConfig& c, int64_t T);
// The expert weights a token passes through: top_k / E of every stacked expert weight.
double active_expert_params(const ModelConfig& c, const std::vector<ParamInfo>& params);

}  // namespace loom::models
