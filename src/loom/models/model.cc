// The generic half of models/: config checks every architecture shares, the architecture table, and
// the graph every model gets (its params, tokens, targets, loss and roles) around the
// architecture's own layers.
#include "loom/models/model.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "loom/core/error.h"
#include "loom/models/architecture.h"
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

int64_t ModelConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  return architecture(arch).default_ffn(*this);
}

void ModelConfig::validate(const std::string& src) const {
  auto bad = [&](const std::string& key, const std::string& why) {
    throw Error(fmt::format("{}: [model] {}: {}", src, key, why));
  };
  if (!has_architecture(arch)) bad("arch", "must be one of " + known() + ", got \"" + arch + "\"");
  if (vocab_size <= 0) bad("vocab_size", "must be > 0");
  if (vocab_size > (int64_t(1) << 31) - 1) bad("vocab_size", "must fit in i32");
  if (d_model <= 0) bad("d_model", "must be > 0");
  if (n_layers <= 0) bad("n_layers", "must be > 0");
  if (n_heads <= 0) bad("n_heads", "must be > 0");
  if (d_model % n_heads) bad("n_heads", fmt::format("must divide d_model = {}", d_model));
  if (n_kv_heads < 0 || n_heads % kv_heads())
    bad("n_kv_heads", fmt::format("must divide n_heads = {}", n_heads));
  if (ffn_hidden < 0) bad("ffn_hidden", "must be >= 0");
  if (max_seq_len <= 0) bad("max_seq_len", "must be > 0");
  if (!(norm_eps > 0)) bad("norm_eps", "must be > 0");
  if (!(rope_theta > 0)) bad("rope_theta", "must be > 0");
  architecture(arch).validate(*this, bad);
}

std::vector<ParamInfo> param_infos(const ModelConfig& c) { return architecture(c.arch).params(c); }

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
  }
  return m;
}

}  // namespace

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
  m.logits = arch.build(b, c, {.tokens = m.tokens, .B = B, .T = T});
  auto ce = b.emit("cross_entropy", {m.logits, m.targets}, {}, {"loss", "dlogits"});
  m.loss = ce[0];
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
  m.logits =
      arch.build(b, c, {.tokens = m.tokens, .B = B, .T = T, .start = m.start, .cache_len = S});
  m.caches = g.inputs_of_kind(ir::ValueKind::state);
  return m;
}

}  // namespace loom::models
