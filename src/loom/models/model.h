// Models: a ModelConfig becomes a forward Graph whose params carry Hugging Face names and layouts,
// so weights move to and from PyTorch unchanged, and whose Roles (ir/roles.h) say what its values
// are. Each architecture is defined in a file of its own (architecture.h); this file is the generic
// part. Nothing here knows about sharding or devices.
//
// Mixed precision (dtype = bf16): every matmul and the attention take bf16 operands (weights cast
// from their f32 masters each step); matmuls accumulate in f32 and return f32; attention returns
// bf16 which feeds the output projection directly. Embeddings, norms, residuals, activations and
// the loss stay f32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/ir/graph.h"
#include "loom/ir/roles.h"

namespace loom::models {

// [model] moe: Mixture-of-Experts MLPs ("Efficient Large Scale Language Modeling with Mixtures of
// Experts"; Mixtral's router). experts = 0: a dense model.
struct MoeConfig {
  int64_t experts = 0;            // E; 0: no MoE layers
  int64_t top_k = 2;              // experts per token
  int64_t every = 1;              // every `every`-th layer is MoE (layers every-1, 2*every-1, ...)
  double capacity_factor = 1.25;  // slots per expert and sequence: ceil(factor * T * top_k / E)
  bool dropless = false;          // capacity T: no token is ever dropped
  double aux_loss = 0.01;         // weight of the load-balancing loss
  // Over what the load-balancing loss counts: "model" (transformers' Mixtral: every MoE layer's
  // tokens together, so one layer's imbalance can hide behind the others') or "layer" (GShard,
  // Switch, fairseq: each layer's own loss, averaged over the layers).
  std::string balance = "model";
  double z_loss = 0.001;  // weight of the router z-loss (ST-MoE)

  bool enabled() const { return experts > 0; }
  bool layer(int64_t l) const { return enabled() && (l + 1) % every == 0; }
  // Slots per expert in each sequence of T tokens.
  int64_t capacity(int64_t T) const;
};

// The largest value each [model] size may take. Every size computed from them (elements, bytes,
// FLOPs) stays inside int64; each is far above any model trained today, and a model that large is
// refused for its memory anyway (train/memory.h) before anything is allocated. The config schema
// (models/config_section.cc) states the same ranges to users.
struct ModelLimits {
  static constexpr int64_t vocab_size = (int64_t(1) << 31) - 1;  // token ids are i32
  static constexpr int64_t d_model = int64_t(1) << 20;
  // deeper graphs cost the memory planner (quadratic in live buffers) minutes; no published model
  // has more than ~130 layers
  static constexpr int64_t n_layers = 1024;
  static constexpr int64_t ffn_hidden = int64_t(1) << 22;
  static constexpr int64_t max_seq_len = int64_t(1) << 24;
  static constexpr int64_t experts = 4096;
  // parameters in all: their bytes, with gradients and moments (16 per parameter), stay far
  // inside int64 (2^52)
  static constexpr int64_t params = int64_t(1) << 48;
};

struct ModelConfig {
  std::string source;          // the config file it came from, for messages ("" when built)
  std::string arch = "llama";  // a registered architecture (architecture.h)
  int64_t vocab_size = 256;
  int64_t d_model = 64;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0: = n_heads (llama only)
  int64_t ffn_hidden = 0;  // 0: the architecture's default (llama 8/3 d rounded up to 16, gpt2 4 d)
  int64_t max_seq_len = 256;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // The output head reuses the token embedding (logits = x E^T; no lm_head.weight), as SmolLM2
  // does. Llama's choice; GPT-2's head is always tied and ignores it.
  bool tie_embeddings = false;
  DType dtype = DType::f32;
  MoeConfig moe;
  // NormFormer (Shleifer et al.): a norm after self-attention, a learned scale per attention head,
  // and a norm after the MLP's activation.
  bool normformer = false;

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_size() const { return d_model / n_heads; }
  int64_t ffn() const;
  // Throws loom::Error naming the key for an inconsistent config (d_model % n_heads, an unknown
  // arch, the architecture's own checks).
  void validate(const std::string& source) const;
};

// One parameter, declared once by its architecture.
struct ParamInfo {
  enum class Init { normal, ones, zeros, scaled_normal };
  // its place in a tensor-parallel pair, or a vocabulary-parallel weight (ir/roles.h)
  enum class Parallel { none, column, row, vocab };
  std::string name;  // Hugging Face name
  Shape shape;
  Init init = Init::normal;
  std::string block;  // its parameter group: "embed", "layers.0", "head" (every group but "embed"
                      // and "head" is a repeated layer: ir::ParamGroup::layer)
  Parallel parallel = Parallel::none;
  int64_t parallel_dim = -1;  // column: the output features' dim; row: the input's; vocab: V's
  bool expert = false;        // stacked per-expert weights (E, ...): ir::Roles::experts
  // The shape weight files hold it in (Hugging Face's; Loom's checkpoints and exports too) where
  // it differs from `shape`: the same elements in the same order, grouped otherwise (GPT-2's fused
  // c_attn is (C, 3C) there and (C, 3, C) here, so its q, k and v columns split apart); empty: as
  // `shape`.
  Shape file_shape;
  const Shape& stored_shape() const { return file_shape.empty() ? shape : file_shape; }
};
// Every parameter of the model, in a fixed order.
std::vector<ParamInfo> param_infos(const ModelConfig& c);
int64_t param_count(const ModelConfig& c);
// A stacked expert weight's Hugging Face name for expert e: Mixtral stores each expert's tensors
// apart ("...experts.w1.weight" -> "...experts.3.w1.weight").
std::string expert_tensor_name(const std::string& stacked, int64_t e);

struct ModelGraph {
  ir::Graph graph;
  int tokens = -1;   // input i32[B,T]
  int targets = -1;  // input i32[B,T]
  int logits = -1;   // f32[B,T,V]
  int loss = -1;     // f32[]: the training objective (ce_loss plus the MoE auxiliary losses)
  int ce_loss = -1;  // f32[]: the cross-entropy alone (= loss for a dense model)
  // MoE models: each MoE layer's tokens per expert after capacity drops (kept) and the choices
  // before them (routed), f32 (L_moe * E), layer-major; -1 when dense.
  int moe_kept = -1, moe_routed = -1;
  // What every step returns whatever else it does: the loss and, for an MoE model, the
  // cross-entropy and the router load.
  std::vector<int> loss_outputs() const {
    std::vector<int> r{loss};
    for (int v : {ce_loss, moe_kept, moe_routed})
      if (v >= 0 && v != loss) r.push_back(v);
    return r;
  }
  ir::Roles roles;  // batch inputs, tensor-parallel weights, parameter groups
  // Incremental decoding (build_decode) only:
  int start = -1;           // input i32[]: the position of the first token
  std::vector<int> caches;  // state: each layer's key cache then value cache, (B,S,NKV,HS)
  // Under a compute dtype other than f32: each weight a matmul reads, as a param in that dtype
  // (weight_copy_name), by the name of its f32 master, which the caller rounds into it once (with
  // kernels' cast_f32_bf16: the bits the step's cast would make). Empty under f32.
  std::map<int, std::string> weight_copies;
};

// A decode step's copy of the weight `master` in dtype t: "model.layers.0.mlp.up_proj.weight.bf16".
std::string weight_copy_name(const std::string& master, DType t);

// Builds the forward graph and loss for a batch of B sequences of T tokens (T <= max_seq_len).
ModelGraph build_model(const ModelConfig& c, int64_t B, int64_t T);

// Incremental decoding (loom sample): the forward of T new tokens per sequence, (B,T) at positions
// start..start+T-1, given as an input so one graph serves every step. Each layer's keys and values
// go into caches of S positions (state values in the compute dtype, kept by the caller between
// steps: positions before start must hold the earlier tokens'), and its attention reads them. The
// logits (B,1,V) are the last new token's; no targets, no loss. Throws loom::Error for S >
// max_seq_len or T outside [1, S].
ModelGraph build_decode(const ModelConfig& c, int64_t B, int64_t T, int64_t S);

// Model FLOPs per token for training (forward + backward), the architecture's count (PaLM appendix
// B: 6 * (non-embedding matmul params + the output head) + 12 * L * T * d_model for attention
// scores and values, forward and backward, full T*T as is customary).
double train_flops_per_token(const ModelConfig& c, int64_t T);

}  // namespace loom::models
