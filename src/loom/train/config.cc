#include "loom/train/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/suggest.h"
#include "loom/sim/cluster.h"
#include "loom/train/hf_dir.h"

namespace loom::train {

namespace {

// One setter per key: reads the node into the config or throws naming the key.
using Setter = std::function<void(Config&, const toml::node&, const std::string& where)>;

template <class F>
Setter as_int(F field) {
  return [field](Config& c, const toml::node& n, const std::string& where) {
    auto v = n.value<int64_t>();
    if (!n.is_integer() || !v) throw Error(where + ": expected an integer");
    field(c) = *v;
  };
}
template <class F>
Setter as_float(F field) {
  return [field](Config& c, const toml::node& n, const std::string& where) {
    if (!n.is_number()) throw Error(where + ": expected a number");
    const double v = *n.value<double>();
    // no key means anything by inf or nan (norm_eps = inf trains a model that learns nothing)
    if (!std::isfinite(v))
      throw Error(fmt::format("{}: must be a finite number, got {}", where, v));
    field(c) = v;
  };
}
template <class F>
Setter as_bool(F field) {
  return [field](Config& c, const toml::node& n, const std::string& where) {
    if (!n.is_boolean()) throw Error(where + ": expected true or false");
    field(c) = *n.value<bool>();
  };
}
template <class F>
Setter as_string(F field) {
  return [field](Config& c, const toml::node& n, const std::string& where) {
    if (!n.is_string()) throw Error(where + ": expected a string");
    field(c) = *n.value<std::string>();
  };
}

// Where the string in `n` stands in `choices`; else an error that lists them ("expected \"sync\" or
// \"async\"").
size_t choice_index(const toml::node& n, const std::string& where,
                    const std::vector<std::string>& choices) {
  auto v = n.value<std::string>();
  auto it = v ? std::find(choices.begin(), choices.end(), *v) : choices.end();
  if (!n.is_string() || it == choices.end()) {
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i) {
      const char* sep = i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
      list += fmt::format("{}\"{}\"", sep, choices[i]);
    }
    throw Error(where + ": expected " + list);
  }
  return size_t(it - choices.begin());
}

// A string that must be one of `choices`.
template <class F>
Setter as_choice(F field, std::vector<std::string> choices) {
  return [field, choices](Config& c, const toml::node& n, const std::string& where) {
    field(c) = choices[choice_index(n, where, choices)];
  };
}

// An enum, written as its `name`: one of `values`.
template <class F, class E>
Setter as_enum(F field, std::vector<E> values, const char* (*name)(E)) {
  std::vector<std::string> names;
  for (E v : values) names.push_back(name(v));
  return [field, values, names](Config& c, const toml::node& n, const std::string& where) {
    field(c) = values[choice_index(n, where, names)];
  };
}

std::vector<std::string> keys_of(const auto& m) {
  std::vector<std::string> r;
  for (const auto& [k, v] : m) r.push_back(k);
  return r;
}

// [model] moe = { experts = 8, top_k = 2, ... }: an inline table of models::MoeConfig's keys.
const std::map<std::string, Setter>& moe_keys() {
  static const std::map<std::string, Setter> keys = {
      {"experts", as_int([](Config& c) -> int64_t& { return c.model.moe.experts; })},
      {"top_k", as_int([](Config& c) -> int64_t& { return c.model.moe.top_k; })},
      {"every", as_int([](Config& c) -> int64_t& { return c.model.moe.every; })},
      {"capacity_factor",
       as_float([](Config& c) -> double& { return c.model.moe.capacity_factor; })},
      {"dropless", as_bool([](Config& c) -> bool& { return c.model.moe.dropless; })},
      {"aux_loss", as_float([](Config& c) -> double& { return c.model.moe.aux_loss; })},
      {"z_loss", as_float([](Config& c) -> double& { return c.model.moe.z_loss; })},
      {"balance", as_choice([](Config& c) -> std::string& { return c.model.moe.balance; },
                            {"model", "layer"})},
  };
  return keys;
}

Setter moe_setter() {
  using M = models::MoeConfig;
  return [](Config& c, const toml::node& n, const std::string& where) {
    const auto& keys = moe_keys();
    const toml::table* t = n.as_table();
    if (!t) throw Error(where + ": expected a table { experts = ..., top_k = ..., ... }");
    c.model.moe = M{};
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      auto it = keys.find(key);
      if (it == keys.end()) {
        throw Error(fmt::format("{}: unknown key '{}'", where, key), suggest(key, keys_of(keys)));
      }
      it->second(c, v, where + "." + key);
    }
  };
}

const std::map<std::string, std::map<std::string, Setter>>& schema() {
  static const std::map<std::string, std::map<std::string, Setter>> s = {
      {"model",
       {
           {"arch", as_string([](Config& c) -> std::string& { return c.model.arch; })},
           {"vocab_size", as_int([](Config& c) -> int64_t& { return c.model.vocab_size; })},
           {"d_model", as_int([](Config& c) -> int64_t& { return c.model.d_model; })},
           {"n_layers", as_int([](Config& c) -> int64_t& { return c.model.n_layers; })},
           {"n_heads", as_int([](Config& c) -> int64_t& { return c.model.n_heads; })},
           {"n_kv_heads", as_int([](Config& c) -> int64_t& { return c.model.n_kv_heads; })},
           {"ffn_hidden", as_int([](Config& c) -> int64_t& { return c.model.ffn_hidden; })},
           {"max_seq_len", as_int([](Config& c) -> int64_t& { return c.model.max_seq_len; })},
           {"norm_eps", as_float([](Config& c) -> double& { return c.model.norm_eps; })},
           {"rope_theta", as_float([](Config& c) -> double& { return c.model.rope_theta; })},
           {"tie_embeddings",
            as_bool([](Config& c) -> bool& { return c.model.tie_embeddings; })},
           {"normformer", as_bool([](Config& c) -> bool& { return c.model.normformer; })},
           {"moe", moe_setter()},
           // not a ModelConfig field: where the starting weights come from (loom export, init)
           {"init", as_string([](Config& c) -> std::string& { return c.init_weights; })},
           {"dtype",
            [](Config& c, const toml::node& n, const std::string& where) {
              auto v = n.value<std::string>();
              if (!n.is_string() || !v || (*v != "f32" && *v != "bf16"))
                throw Error(where + ": expected \"f32\" or \"bf16\"");
              parse_dtype(*v, &c.model.dtype);
            }},
       }},
      {"train",
       {
           {"batch_size", as_int([](Config& c) -> int64_t& { return c.train.batch_size; })},
           {"seq_len", as_int([](Config& c) -> int64_t& { return c.train.seq_len; })},
           {"seed", as_int([](Config& c) -> int64_t& { return c.train.seed; })},
           {"steps", as_int([](Config& c) -> int64_t& { return c.train.steps; })},
           {"warmup_steps", as_int([](Config& c) -> int64_t& { return c.train.warmup_steps; })},
           {"min_lr", as_float([](Config& c) -> double& { return c.train.min_lr; })},
           {"eval_every", as_int([](Config& c) -> int64_t& { return c.train.eval_every; })},
           {"eval_batches", as_int([](Config& c) -> int64_t& { return c.train.eval_batches; })},
           {"grad_accum", as_int([](Config& c) -> int64_t& { return c.train.grad_accum; })},
       }},
      {"data",
       {
           {"path", as_string([](Config& c) -> std::string& { return c.data.path; })},
       }},
      {"checkpoint",
       {
           {"every", as_int([](Config& c) -> int64_t& { return c.checkpoint.every; })},
           {"keep", as_int([](Config& c) -> int64_t& { return c.checkpoint.keep; })},
       }},
      {"outer",
       {
           {"server", as_string([](Config& c) -> std::string& { return c.outer.server; })},
           {"mode", as_enum([](Config& c) -> OuterMode& { return c.outer.mode; },
                            {OuterMode::sync, OuterMode::async}, outer_mode_name)},
           {"compress", as_choice([](Config& c) -> std::string& { return c.outer.compress; },
                                  {"f32", "bf16"})},
           {"inner_steps", as_int([](Config& c) -> int64_t& { return c.outer.inner_steps; })},
           {"lr", as_float([](Config& c) -> double& { return c.outer.lr; })},
           {"momentum", as_float([](Config& c) -> double& { return c.outer.momentum; })},
           {"delay", as_int([](Config& c) -> int64_t& { return c.outer.delay; })},
           {"islands", as_int([](Config& c) -> int64_t& { return c.outer.islands; })},
           {"lease_s", as_float([](Config& c) -> double& { return c.outer.lease_s; })},
           {"retry_s", as_float([](Config& c) -> double& { return c.outer.retry_s; })},
           {"token_file", as_string([](Config& c) -> std::string& { return c.outer.token_file; })},
           {"tls_ca", as_string([](Config& c) -> std::string& { return c.outer.tls_ca; })},
           {"tls_cert", as_string([](Config& c) -> std::string& { return c.outer.tls_cert; })},
           {"tls_key", as_string([](Config& c) -> std::string& { return c.outer.tls_key; })},
       }},
      {"plan",
       {
           {"mesh",
            [](Config& c, const toml::node& n, const std::string& where) {
              const toml::table* t = n.as_table();
              if (!t || t->empty())
                throw Error(where + ": expected a table of axis sizes",
                            "mesh = { data = 2, model = 2 }");
              // toml++ keeps keys sorted; the mesh keeps the order they were written in
              std::vector<std::pair<toml::source_position, std::pair<std::string, int64_t>>> axes;
              for (const auto& [k, v] : *t) {
                auto size = v.value<int64_t>();
                if (!v.is_integer() || !size)
                  throw Error(fmt::format("{}: axis {} needs an integer size", where, k.str()));
                axes.push_back({k.source().begin, {std::string(k.str()), *size}});
              }
              std::stable_sort(axes.begin(), axes.end(), [](const auto& a, const auto& b) {
                return a.first.line != b.first.line ? a.first.line < b.first.line
                                                    : a.first.column < b.first.column;
              });
              std::vector<std::pair<std::string, int64_t>> m;
              for (auto& a : axes) m.push_back(std::move(a.second));
              c.plan.plan.mesh = shard::Mesh(std::move(m), where);
            }},
           {"tactics",
            [](Config& c, const toml::node& n, const std::string& where) {
              const toml::array* a = n.as_array();
              if (!a) throw Error(where + ": expected an array of tables",
                                  "tactics = [ { kind = \"fsdp\", axis = \"data\" } ]");
              c.plan.plan.tactics.clear();
              for (size_t i = 0; i < a->size(); ++i) {
                std::string at = fmt::format("{}[{}]", where, i);
                const toml::table* t = (*a)[i].as_table();
                if (!t) throw Error(at + ": expected a table { kind = ..., axis = ... }");
                shard::Tactic tac;
                for (const auto& [k, node] : *t) {
                  std::string key(k.str());
                  const toml::node& v = node;  // a structured binding clang 14 cannot capture
                  auto str = [&]() {
                    if (!v.is_string()) throw Error(fmt::format("{}: {} must be a string", at, key));
                    return *v.value<std::string>();
                  };
                  if (key == "kind") tac.kind = str();
                  else if (key == "axis") tac.axis = str();
                  else if (key == "pattern") tac.pattern = str();
                  else if (key == "dim") {
                    if (!v.is_integer()) throw Error(fmt::format("{}: dim must be an integer", at));
                    tac.dim = *v.value<int64_t>();
                  } else {
                    throw Error(fmt::format("{}: unknown key '{}'", at, key),
                                suggest(key, {"kind", "axis", "pattern", "dim"}));
                  }
                }
                const auto& kinds = shard::tactic_kinds();
                if (std::find(kinds.begin(), kinds.end(), tac.kind) == kinds.end())
                  throw Error(fmt::format("{}: unknown tactic kind '{}'", at, tac.kind),
                              suggest(tac.kind, kinds));
                if (tac.axis.empty()) throw Error(at + ": missing key 'axis'");
                if (tac.kind == "shard" && (tac.pattern.empty() || tac.dim < 0))
                  throw Error(at + ": a shard tactic needs pattern and dim",
                              "{ kind = \"shard\", pattern = \"lm_head.weight\", dim = 0, axis = \"model\" }");
                c.plan.plan.tactics.push_back(tac);
              }
            }},
           {"ranks", as_choice([](Config& c) -> std::string& { return c.plan.ranks; },
                               {"mpi", "local"})},
       }},
      {"passes",
       {
           {"bucket",
            as_enum([](Config& c) -> passes::ScheduleOptions::Bucket& { return c.passes.bucket; },
                    {passes::ScheduleOptions::Bucket::none, passes::ScheduleOptions::Bucket::block,
                     passes::ScheduleOptions::Bucket::automatic},
                    passes::bucket_name)},
           {"bucket_mb", as_float([](Config& c) -> double& { return c.passes.bucket_mb; })},
           {"cluster",
            as_string([](Config& c) -> std::string& { return c.passes.cluster_file; })},
           {"reshard_after_forward",
            as_bool([](Config& c) -> bool& { return c.passes.reshard_after_forward; })},
           {"cast_before_gather",
            as_bool([](Config& c) -> bool& { return c.passes.cast_before_gather; })},
           {"recompute", as_enum(
                             [](Config& c) -> passes::ScheduleOptions::Recompute& {
                               return c.passes.recompute;
                             },
                             {passes::ScheduleOptions::Recompute::none,
                              passes::ScheduleOptions::Recompute::selective,
                              passes::ScheduleOptions::Recompute::selective_op,
                              passes::ScheduleOptions::Recompute::full},
                             passes::recompute_name)},
           {"prefetch", as_bool([](Config& c) -> bool& { return c.passes.prefetch; })},
           {"max_in_flight",
            as_int([](Config& c) -> int64_t& { return c.passes.max_in_flight; })},
       }},
      {"optim",
       {
           {"lr", as_float([](Config& c) -> double& { return c.optim.lr; })},
           {"beta1", as_float([](Config& c) -> double& { return c.optim.beta1; })},
           {"beta2", as_float([](Config& c) -> double& { return c.optim.beta2; })},
           {"eps", as_float([](Config& c) -> double& { return c.optim.eps; })},
           {"weight_decay", as_float([](Config& c) -> double& { return c.optim.weight_decay; })},
           {"grad_clip", as_float([](Config& c) -> double& { return c.optim.grad_clip; })},
       }},
  };
  return s;
}

void apply_override(toml::table& root, const std::string& path, const std::string& ov) {
  size_t eq = ov.find('=');
  size_t dot = ov.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw Error(fmt::format("--set {}: expected section.key=value", ov),
                "for example --set model.dtype=bf16");
  std::string section = ov.substr(0, dot), key = ov.substr(dot + 1, eq - dot - 1);
  std::string value = ov.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* sec = root[section].as_table();
  if (!sec) throw Error(fmt::format("{}: [{}] is not a table", path, section));
  sec->insert_or_assign(key, *parsed["v"].node());
}

// [model] init naming a Hugging Face directory (hf_dir.h) decides the model: its config.json's keys
// fill [model]; a key the config also sets must agree (max_seq_len may be lower: a shorter context
// than the model was trained for). The keys land in `root`, so a run's saved config.toml holds the
// whole model and a resume needs no config.json.
void merge_hf_model(toml::table& root, const std::string& path) {
  toml::table* model = root["model"].as_table();
  if (!model) return;
  auto init = (*model)["init"].value<std::string>();
  if (!init || !is_hf_dir(*init)) return;
  const models::ModelConfig h = read_hf_model(*init);
  const toml::table from_hf{{"arch", h.arch},
                            {"vocab_size", h.vocab_size},
                            {"d_model", h.d_model},
                            {"n_layers", h.n_layers},
                            {"n_heads", h.n_heads},
                            {"n_kv_heads", h.n_kv_heads},
                            {"ffn_hidden", h.ffn_hidden},
                            {"max_seq_len", h.max_seq_len},
                            {"norm_eps", h.norm_eps},
                            {"rope_theta", h.rope_theta},
                            {"tie_embeddings", h.tie_embeddings}};
  for (const auto& [k, v] : from_hf) {
    const std::string key(k.str());
    const toml::node* mine = model->get(key);
    // absent, or 0 for the two keys where 0 means "the default": config.json's value
    if (!mine || ((key == "ffn_hidden" || key == "n_kv_heads") && mine->value<int64_t>() == 0)) {
      model->insert_or_assign(key, v);
      continue;
    }
    bool same = true;
    if (auto s = v.value<std::string>())
      same = mine->value<std::string>() == s;
    else if (auto b = v.value<bool>(); v.is_boolean())
      same = mine->value<bool>() == b;
    else if (auto x = mine->value<double>())
      same = key == "max_seq_len" ? *x <= *v.value<double>() : *x == *v.value<double>();
    if (!same) {
      std::ostringstream theirs, ours;
      v.visit([&](const auto& x) { theirs << x; });
      mine->visit([&](const auto& x) { ours << x; });
      throw Error(fmt::format("{}: [model] {} = {} disagrees with {}/config.json, which gives {}",
                              path, key, ours.str(), *init, theirs.str()),
                  "[model] init names a Hugging Face directory, whose config.json decides the "
                  "model: drop the key from [model] (only max_seq_len may be lower)");
    }
  }
}

}  // namespace

const char* outer_mode_name(OuterMode m) { return m == OuterMode::sync ? "sync" : "async"; }

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const auto& [section, keys] : schema())
    for (const auto& [key, setter] : keys) {
      out.push_back(fmt::format("[{}] {}", section, key));
      if (section == "model" && key == "moe")
        for (const auto& [k, v] : moe_keys()) out.push_back(fmt::format("[model] moe.{}", k));
    }
  return out;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   ConfigUse use) {
  toml::table root;
  try {
    root = toml::parse(read_file(path), path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    std::string desc(e.description());
    if (!src.begin) throw Error(fmt::format("{}: {}", path, desc));
    throw Error(
        fmt::format("{}:{}:{}: TOML error: {}", path, src.begin.line, src.begin.column, desc));
  }
  for (const auto& ov : overrides) apply_override(root, path, ov);
  merge_hf_model(root, path);

  Config c;
  c.path = path;
  bool have_arch = false;
  std::set<std::string> written;  // "[section] key" of every key the file or a --set gave
  const auto& sch = schema();
  for (const auto& [sk, sv] : root) {
    std::string section(sk.str());
    auto sit = sch.find(section);
    if (sit == sch.end())
      throw Error(fmt::format("{}: unknown section [{}]", path, section),
                  suggest(section, keys_of(sch)));
    const toml::table* t = sv.as_table();
    if (!t) throw Error(fmt::format("{}: [{}] must be a table", path, section));
    for (const auto& [kk, kv] : *t) {
      std::string key(kk.str());
      auto kit = sit->second.find(key);
      if (kit == sit->second.end())
        throw Error(fmt::format("{}: unknown key '{}' in [{}]", path, key, section),
                    suggest(key, keys_of(sit->second)));
      kit->second(c, kv, fmt::format("{}: [{}] {}", path, section, key));
      if (section == "model" && key == "arch") have_arch = true;
      written.insert(fmt::format("[{}] {}", section, key));
    }
  }
  if (!have_arch)
    throw Error(fmt::format("{}: missing key 'arch' in [model]", path),
                "add [model] arch = \"llama\" or \"gpt2\"");
  c.model.validate(path);
  c.model.source = path;
  if (use == ConfigUse::model_only) return c;
  // key: "[section] key". A key the user never wrote holds its default: the message says so.
  auto bad = [&](const std::string& key, const std::string& why) {
    if (written.count(key)) throw Error(fmt::format("{}: {}: {}", path, key, why));
    throw Error(fmt::format("{}: {}: {} (that is its default value: the file does not set it)",
                            path, key, why),
                fmt::format("set {} in the config, or with --set", key));
  };
  auto in_range = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) bad(key, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
  };
  // upper bounds: sizes computed from these stay inside int64 (memory is checked before anything
  // is allocated: train/memory.h)
  in_range("[train] batch_size", c.train.batch_size, 1, int64_t(1) << 20);
  in_range("[train] grad_accum", c.train.grad_accum, 1, int64_t(1) << 20);
  in_range("[train] eval_batches", c.train.eval_batches, 1, int64_t(1) << 20);
  in_range("[train] steps", c.train.steps, 1, int64_t(1) << 40);
  // H travels to and from the outer server as a u32
  in_range("[outer] inner_steps", c.outer.inner_steps, 1, (int64_t(1) << 31) - 1);
  if (c.train.seq_len <= 0) bad("[train] seq_len", "must be > 0");
  if (c.train.seq_len > c.model.max_seq_len)
    bad("[train] seq_len", fmt::format("exceeds [model] max_seq_len = {}", c.model.max_seq_len));
  if (!(c.optim.lr >= 0)) bad("[optim] lr", "must be >= 0");
  if (!(c.optim.beta1 >= 0 && c.optim.beta1 < 1)) bad("[optim] beta1", "must be in [0, 1)");
  if (!(c.optim.beta2 >= 0 && c.optim.beta2 < 1)) bad("[optim] beta2", "must be in [0, 1)");
  if (!(c.optim.eps > 0)) bad("[optim] eps", "must be > 0");
  if (!(c.optim.weight_decay >= 0)) bad("[optim] weight_decay", "must be >= 0");
  if (c.train.warmup_steps < 0) bad("[train] warmup_steps", "must be >= 0");
  if (!(c.train.min_lr >= 0)) bad("[train] min_lr", "must be >= 0");
  if (c.train.min_lr > c.optim.lr)
    bad("[train] min_lr",
        fmt::format("must be at most [optim] lr = {} (the schedule decays to it), "
                    "got {}",
                    c.optim.lr, c.train.min_lr));
  if (!(c.optim.grad_clip >= 0))
    bad("[optim] grad_clip",
        fmt::format("must be >= 0 (0: no clipping), got {}", c.optim.grad_clip));
  if (c.train.eval_every < 0) bad("[train] eval_every", "must be >= 0");
  if (!(c.outer.lr > 0)) bad("[outer] lr", "must be > 0");
  if (!(c.outer.momentum >= 0 && c.outer.momentum < 1))
    bad("[outer] momentum", "must be in [0, 1)");
  if (c.outer.delay < 0) bad("[outer] delay", "must be >= 0");
  if (c.outer.islands < 0) bad("[outer] islands", "must be >= 0");
  // durations become clock ticks (nanoseconds in int64: at most 292 years); a day is plenty
  if (!(c.outer.lease_s > 0 && c.outer.lease_s <= 86400))
    bad("[outer] lease_s", fmt::format("must be in (0, 86400] seconds, got {}", c.outer.lease_s));
  if (!(c.outer.retry_s >= 0 && c.outer.retry_s <= 86400))
    bad("[outer] retry_s", fmt::format("must be in [0, 86400] seconds, got {}", c.outer.retry_s));
  if (!(c.outer.lr <= 1e3))
    bad("[outer] lr", fmt::format("must be at most 1000, got {}", c.outer.lr));
  if (c.checkpoint.every < 0) bad("[checkpoint] every", "must be >= 0");
  if (c.checkpoint.keep < 0) bad("[checkpoint] keep", "must be >= 0 (0 keeps all)");
  if (!(c.passes.bucket_mb > 0 && c.passes.bucket_mb <= 1e6))
    bad("[passes] bucket_mb", "must be > 0 and at most 1e6 (a terabyte)");
  if (c.passes.max_in_flight < 1) bad("[passes] max_in_flight", "must be >= 1");
  if (c.passes.bucket == passes::ScheduleOptions::Bucket::automatic) {
    try {
      c.passes.cluster =
          std::make_shared<const sim::Cluster>(sim::load_cluster(c.passes.cluster_file));
    } catch (const Error& e) {
      bad("[passes] cluster", std::string("bucket = \"auto\" needs it: ") + e.what());
    }
  }
  c.plan.plan.where = fmt::format("{}: [plan]", path);
  if (c.plan.plan.empty() && !c.plan.plan.tactics.empty())
    bad("[plan] tactics", "need a mesh: add [plan] mesh = { data = 2 }");
  {
    // Full float precision (0.9 prints as 0.90000000000000002): toml++'s relaxed mode rounds to six
    // digits, which would change a learning rate like 0.123456789 in the run's saved config.
    std::ostringstream os;
    os << root;
    c.text = os.str() + "\n";
    // ... and the mesh in the order it was written, not toml++'s sorted order
    if (const toml::table* plan = root["plan"].as_table(); plan && plan->contains("mesh")) {
      std::ostringstream m;
      if (const toml::table* mt = (*plan)["mesh"].as_table()) m << *mt;
      std::string written = "{ ";
      for (size_t i = 0; i < c.plan.plan.mesh.axes().size(); ++i) {
        const auto& [a, n] = c.plan.plan.mesh.axes()[i];
        written += fmt::format("{}{} = {}", i ? ", " : "", a, n);
      }
      written += " }";
      size_t at = c.text.find("mesh = " + m.str());
      if (at != std::string::npos) c.text.replace(at + 7, m.str().size(), written);
    }
  }
  return c;
}

}  // namespace loom::train
