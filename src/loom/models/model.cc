// The generic half of models/: config checks every architecture shares, the architecture table, and
// the graph every model gets (its params, tokens, targets, loss and roles) around the
// architecture's own layers.
#include "loom/models/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "loom/config/schema.h"
#include "loom/core/error.h"
#include "loom/models/architecture.h"
#include "loom/models/config_section.h"
#include "loom/ops/builder.h"

namespace loom::models {

namespace {

std::map<std::string, Architecture, std::less<>>& table() {
  static std::map<std::string, Architecture, std::less<>> t;
  return t;
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_llama();
    register_gpt2();
  });
}

std::string known() {
  std::string r;
  for (const auto& name : architecture_names()) r += (r.empty() ? "\"" : ", \"") + name + "\"";
  return r;
}

}  // namespace

void register_architecture(Architecture a) {
  LOOM_CHECK(!table().count(a.name)) << "architecture registered twice: " << a.name;
  LOOM_CHECK(a.validate && a.default_ffn && a.params && a.build && a.train_flops_per_token &&
             a.hf_config)
      << "architecture " << a.name << " leaves a field empty";
  std::string name = a.name;
  table().emplace(std::move(name), std::move(a));
}

bool has_architecture(std::string_view name) {
  ensure_registered();
  return table().find(name) != table().end();
}

const Architecture& architecture(std::string_view name) {
  ensure_registered();
  auto it = table().find(name);
  if (it == table().end())
    throw Error(fmt::format("unknown model architecture \"{}\"", name), "one of: " + known());
  return it->second;
}

std::vector<std::string> architecture_names() {
  ensure_registered();
  std::vector<std::string> r;
  for (const auto& [name, a] : table()) r.push_back(name);
  return r;
}

ModelConfig model_from_hf(const nlohmann::json& config, const std::string& file) {
  ensure_registered();
  HfConfigReader r(config, file);
  const std::string type = r.string("model_type");
  for (const auto& [name, a] : table()) {
    if (a.hf_model_type != type || !a.from_hf) continue;
    // "architectures" names the head class; Loom builds the causal LM one
    r.require("architectures", {nlohmann::json::array({a.hf_class})},
              fmt::format("Loom builds {} for model_type \"{}\"", a.hf_class, type));
    ModelConfig c = a.from_hf(r);
    c.arch = name;
    r.finish();
    // every key in the range a TOML [model] is held to (an rms_norm_eps of 1e300, which no f32
    // holds, passed here where TOML refused it)
    for (const config::Key<ModelConfig>& k : model_section().keys)
      if (k.out_of_range)
        if (const std::string why = k.out_of_range(c); !why.empty())
          throw Error(fmt::format("{}: gives [model] {}, which {}", file, k.name, why));
    c.validate(file);
    return c;
  }
  std::string types;
  for (const auto& [name, a] : table())
    if (a.from_hf) types += (types.empty() ? "\"" : ", \"") + a.hf_model_type + "\"";
  r.bad("model_type", "an architecture Loom does not build (it reads " + types + ")");
}

double palm_train_flops(double matmul_params, const ModelConfig& c, int64_t T) {
  return 6.0 * matmul_params + 12.0 * double(c.n_layers) * double(T) * double(c.d_model);
}

double active_expert_params(const ModelConfig& c, const std::vector<ParamInfo>& params) {
  double n = 0;
  for (const auto& p : params)
    if (p.expert) n += double(numel(p.shape)) * double(c.moe.top_k) / double(c.moe.experts);
  return n;
}

int64_t MoeConfig::capacity(int64_t T) const {
  if (dropless) return T;
  const double slots = std::ceil(capacity_factor * double(T) * double(top_k) / double(experts));
  return std::clamp<int64_t>(int64_t(slots), 1, T);
}

int64_t ModelConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  return architecture(arch).default_ffn(*this);
}

void ModelConfig::validate(const std::string& src) const {
  auto bad = [&](const std::string& key, const std::string& why) {
    throw Error(fmt::format("{}: [model] {}: {}", src, key, why));
  };
  if (!has_architecture(arch)) bad("arch", "must be one of " + known() + ", got \"" + arch + "\"");
  using L = ModelLimits;
  auto in_range = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) bad(key, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
  };
  in_range("vocab_size", vocab_size, 1, L::vocab_size);
  in_range("d_model", d_model, 1, L::d_model);
  in_range("n_layers", n_layers, 1, L::n_layers);
  in_range("max_seq_len", max_seq_len, 1, L::max_seq_len);
  in_range("ffn_hidden", ffn_hidden, 0, L::ffn_hidden);
  in_range("moe.experts", moe.experts, 0, L::experts);
  if (n_heads <= 0) bad("n_heads", "must be > 0");
  if (d_model % n_heads) bad("n_heads", fmt::format("must divide d_model = {}", d_model));
  if (n_kv_heads < 0 || n_heads % kv_heads())
    bad("n_kv_heads", fmt::format("must divide n_heads = {}", n_heads));
  if (!(norm_eps > 0)) bad("norm_eps", "must be > 0");
  if (!(rope_theta > 0)) bad("rope_theta", "must be > 0");
  if (moe.enabled()) {
    if (moe.top_k < 1 || moe.top_k > moe.experts)
      bad("moe.top_k", fmt::format("must be in [1, experts = {}], got {}", moe.experts, moe.top_k));
    if (moe.every < 1 || moe.every > n_layers)
      bad("moe.every", fmt::format("must be in [1, n_layers = {}], got {}", n_layers, moe.every));
    if (!(moe.capacity_factor > 0) || !std::isfinite(moe.capacity_factor))
      bad("moe.capacity_factor", "must be a finite number > 0");
    if (!(moe.aux_loss >= 0) || !std::isfinite(moe.aux_loss))
      bad("moe.aux_loss", "must be a finite number >= 0");
    if (moe.balance != "model" && moe.balance != "layer")
      bad("moe.balance", "must be \"model\" or \"layer\", got \"" + moe.balance + "\"");
    if (!(moe.z_loss >= 0) || !std::isfinite(moe.z_loss))
      bad("moe.z_loss", "must be a finite number >= 0");
  }
  architecture(arch).validate(*this, bad);
  // the sizes together: every byte count derived from the parameter count stays inside int64
  long double total = 0;
  for (const ParamInfo& p : param_infos(*this)) {
    long double n = 1;
    for (int64_t d : p.shape) n *= (long double)d;
    total += n;
  }
  if (total > (long double)L::params)
    throw Error(fmt::format("{}: [model]: {:.3g} parameters, more than Loom's limit of 2^48 (its "
                            "byte counts would leave int64)",
                            src, double(total)),
                "make d_model, ffn_hidden, n_layers or moe.experts smaller");
}

std::vector<ParamInfo> param_infos(const ModelConfig& c) { return architecture(c.arch).params(c); }

std::string expert_tensor_name(const std::string& stacked, int64_t e) {
  const size_t at = stacked.rfind("experts.");
  LOOM_CHECK(at != std::string::npos) << stacked << " is not an expert weight";
  return stacked.substr(0, at + 8) + std::to_string(e) + "." + stacked.substr(at + 8);
}

int64_t param_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& p : param_infos(c)) n += numel(p.shape);
  return n;
}

double train_flops_per_token(const ModelConfig& c, int64_t T) {
  return architecture(c.arch).train_flops_per_token(c, T);
}

namespace {

// The graph's params, with their roles, as the architecture declares them.
ModelGraph declare_params(const Architecture& arch, const ModelConfig& c) {
  ModelGraph m;
  m.graph = ir::Graph(c.arch);
  ir::Graph& g = m.graph;
  for (const auto& p : arch.params(c)) {
    int v = g.add_input(p.name, {DType::f32, p.shape}, ir::ValueKind::param);
    if (m.roles.blocks.empty() || m.roles.blocks.back().name != p.block)
      m.roles.blocks.push_back({p.block, {}});
    m.roles.blocks.back().params.push_back(v);
    if (p.parallel == ParamInfo::Parallel::column)
      m.roles.column_parallel.push_back({v, p.parallel_dim});
    if (p.parallel == ParamInfo::Parallel::row) m.roles.row_parallel.push_back({v, p.parallel_dim});
    if (p.parallel == ParamInfo::Parallel::vocab)
      m.roles.vocab_parallel.push_back({v, p.parallel_dim});
    if (p.expert) m.roles.experts.push_back(v);
  }
  return m;
}

}  // namespace

// The MoE objective and load outputs, from every MoE layer's router sums over its N tokens:
//   loss = ce + aux_loss * E * sum_e f_e P_e + z_loss * mean over tokens of logsumexp^2,
// with f_e the fraction of all layers' token choices that went to expert e and P_e the mean
// router probability of e over all layers' tokens: transformers' Mixtral load_balancing_loss_func
// (its layers' router logits concatenated; top_k choices per token, so sum_e f_e = top_k). With
// moe.balance = "layer", E sum_e f_e P_e is each layer's own, averaged over the layers.
void add_moe_losses(ops::Builder& b, const ModelConfig& c, const std::vector<MoeLayerStats>& moe,
                    int64_t N, ModelGraph& m) {
  auto total = [&](int MoeLayerStats::*field) {
    int t = moe[0].*field;
    for (size_t i = 1; i < moe.size(); ++i) t = b.add(t, moe[i].*field);
    return t;
  };
  const double tokens = double(N) * double(moe.size());
  int aux;
  if (c.moe.balance == "layer") {  // the mean over layers of E sum_e f_e P_e, each layer's own
    int sum = -1;
    for (const auto& l : moe) {
      int one = b.emit1(ir::Op::sum, {b.mul(l.routed, l.prob_sum)});
      sum = sum < 0 ? one : b.add(sum, one);
    }
    aux = b.scale(sum, double(c.moe.experts) / (double(N) * double(N) * double(moe.size())),
                  "aux_loss");
  } else {
    int balance = b.emit1(ir::Op::sum,
                          {b.mul(total(&MoeLayerStats::routed), total(&MoeLayerStats::prob_sum))});
    aux = b.scale(balance, double(c.moe.experts) / (tokens * tokens), "aux_loss");
  }
  int z = b.scale(total(&MoeLayerStats::z_sum), 1.0 / tokens, "z_loss");
  int objective = b.add(b.scale(aux, c.moe.aux_loss), b.scale(z, c.moe.z_loss));
  m.loss = b.add(m.ce_loss, objective, "loss");
  std::vector<int> kept, routed_each;
  for (const auto& l : moe) kept.push_back(l.kept), routed_each.push_back(l.routed);
  auto concat = [&](const std::vector<int>& vs, const std::string& name) {
    if (vs.size() == 1) return vs[0];
    return b.emit1(ir::Op::concat, vs, {}, name);
  };
  m.moe_kept = concat(kept, "moe_kept");
  m.moe_routed = concat(routed_each, "moe_routed");
}

ModelGraph build_model(const ModelConfig& c, int64_t B, int64_t T) {
  c.validate("<model>");
  if (T > c.max_seq_len)
    throw Error(
        fmt::format("sequence length {} exceeds [model] max_seq_len = {}", T, c.max_seq_len));
  const Architecture& arch = architecture(c.arch);
  ModelGraph m = declare_params(arch, c);
  ir::Graph& g = m.graph;
  m.tokens = g.add_input("tokens", {DType::i32, {B, T}}, ir::ValueKind::input);
  m.targets = g.add_input("targets", {DType::i32, {B, T}}, ir::ValueKind::input);
  m.roles.batch_inputs = {m.tokens, m.targets};
  ops::Builder b(g);
  std::vector<MoeLayerStats> moe;
  m.logits = arch.build(b, c, {.tokens = m.tokens, .B = B, .T = T, .moe = &moe});
  auto ce = b.emit(ir::Op::cross_entropy, {m.logits, m.targets}, {},
                   {moe.empty() ? "loss" : "ce_loss", "dlogits"});
  m.loss = m.ce_loss = ce[0];
  if (!moe.empty()) add_moe_losses(b, c, moe, B * T, m);
  return m;
}

ModelGraph build_decode(const ModelConfig& c, int64_t B, int64_t T, int64_t S) {
  c.validate("<model>");
  if (S > c.max_seq_len)
    throw Error(fmt::format("key/value cache of {} positions exceeds [model] max_seq_len = {}", S,
                            c.max_seq_len));
  if (T < 1 || T > S)
    throw Error(fmt::format("a decode step of {} tokens does not fit a cache of {}", T, S));
  const Architecture& arch = architecture(c.arch);
  ModelGraph m = declare_params(arch, c);
  ir::Graph& g = m.graph;
  m.tokens = g.add_input("tokens", {DType::i32, {B, T}}, ir::ValueKind::input);
  m.start = g.add_input("start", {DType::i32, {}}, ir::ValueKind::input);
  m.roles.batch_inputs = {m.tokens};
  ops::Builder b(g);
  const bool copies = c.dtype != DType::f32;
  m.logits = arch.build(b, c,
                        {.tokens = m.tokens,
                         .B = B,
                         .T = T,
                         .start = m.start,
                         .cache_len = S,
                         .weight_copies = copies ? &m.weight_copies : nullptr});
  m.caches = g.inputs_of_kind(ir::ValueKind::state);
  return m;
}

std::string weight_copy_name(const std::string& master, DType t) {
  return master + "." + std::string(dtype_name(t));
}

}  // namespace loom::models
