#include "loom/train/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/suggest.h"
#include "loom/shard/tactic.h"
#include "loom/sim/cluster.h"
#include "loom/train/hf_dir.h"

namespace loom::train {

namespace {

// ---- the schema: every key with its type, default, range and meaning ----

// A numeric key's valid values: from lo to hi, either end open; an infinite end is no bound.
struct Range {
  double lo = -INFINITY, hi = INFINITY;
  bool lo_open = false, hi_open = false;

  bool any() const { return std::isinf(lo) && std::isinf(hi); }
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};
Range closed(double lo, double hi) { return {lo, hi}; }
Range at_least(double lo) { return {lo, INFINITY}; }
Range above(double lo) { return {lo, INFINITY, true}; }
Range below_one() { return {0, 1, false, true}; }  // [0, 1): betas, momentum
Range any_value() { return {}; }

// A bound as users read it: 2^20 for a large power of two, 2^31-1 beside one, 1e6 for a large power
// of ten, else the shortest decimal.
std::string bound_text(double x) {
  for (int k = 16; k < 63; ++k) {
    const double p = std::ldexp(1.0, k);
    if (x == p) return fmt::format("2^{}", k);
    if (x == p - 1) return fmt::format("2^{}-1", k);
  }
  for (int k = 5; k < 16; ++k)
    if (x == std::pow(10.0, k)) return fmt::format("1e{}", k);
  return fmt::format("{}", x);
}

std::string range_text(const Range& r) {
  if (r.any()) return "";
  if (std::isinf(r.hi)) return fmt::format("{} {}", r.lo_open ? ">" : ">=", bound_text(r.lo));
  return fmt::format("{}{}, {}{}", r.lo_open ? "(" : "[", bound_text(r.lo), bound_text(r.hi),
                     r.hi_open ? ")" : "]");
}

// One key: how to read it into a Config (type-checked; a bad value throws naming `where`), and
// what docs/config.md says of it. A numeric key's `out_of_range` checks its value against its
// range, which load_config asks of every numeric key once all are set.
struct Key {
  std::string name;  // "batch_size"; "moe.top_k" for an inline table's
  std::string type;  // "int", "float", "bool", "string", ...
  std::function<void(Config&, const toml::node&, const std::string& where)> set;
  // numeric keys: "" when the value is in `range`, else "must be in [1, 2^20], got 0"
  std::function<std::string(Config&)> out_of_range;
  Range range;
  std::string default_text;  // as the docs print it
  std::string meaning;       // what it does, its choices, rules that involve other keys
};

// `field`'s range check (Key::out_of_range).
template <class F>
std::function<std::string(Config&)> range_check(F field, Range range) {
  return [field, range](Config& c) -> std::string {
    const auto v = field(c);
    if (range.contains(double(v))) return "";
    return fmt::format("must be {}{}, got {}", std::isinf(range.hi) ? "" : "in ", range_text(range),
                       v);
  };
}

// The integer in `n`, if it holds one. (toml++'s value<int64_t>() converts a float node too, and
// its own conversion of one outside int64, such as 1e24, is undefined behaviour: ask first.)
std::optional<int64_t> integer_in(const toml::node& n) {
  if (!n.is_integer()) return std::nullopt;
  return n.value<int64_t>();
}

std::string quoted(const std::string& s) { return s.empty() ? "none" : "`\"" + s + "\"`"; }

// The default of a key read through `field` from a default-constructed Config.
template <class F>
auto default_of(F field) {
  Config c;
  return field(c);
}

template <class F>
Key int_key(std::string name, F field, Range range, std::string meaning,
            std::string default_text = "") {
  return {std::move(name),
          "int",
          [field](Config& c, const toml::node& n, const std::string& where) {
            auto v = integer_in(n);
            if (!v) throw Error(where + ": expected an integer");
            field(c) = *v;
          },
          range_check(field, range),
          range,
          default_text.empty() ? fmt::format("{}", default_of(field)) : default_text,
          std::move(meaning)};
}

template <class F>
Key float_key(std::string name, F field, Range range, std::string meaning) {
  return {std::move(name),
          "float",
          [field](Config& c, const toml::node& n, const std::string& where) {
            if (!n.is_number()) throw Error(where + ": expected a number");
            const double v = *n.value<double>();
            // no key means anything by inf or nan (norm_eps = inf trains a model that learns
            // nothing)
            if (!std::isfinite(v))
              throw Error(fmt::format("{}: must be a finite number, got {}", where, v));
            field(c) = v;
          },
          range_check(field, range),
          range,
          fmt::format("{}", default_of(field)),
          std::move(meaning)};
}

template <class F>
Key bool_key(std::string name, F field, std::string meaning) {
  return {std::move(name),
          "bool",
          [field](Config& c, const toml::node& n, const std::string& where) {
            if (!n.is_boolean()) throw Error(where + ": expected true or false");
            field(c) = *n.value<bool>();
          },
          nullptr,
          {},
          default_of(field) ? "true" : "false",
          std::move(meaning)};
}

template <class F>
Key string_key(std::string name, F field, std::string meaning, std::string default_text = "") {
  return {std::move(name),
          "string",
          [field](Config& c, const toml::node& n, const std::string& where) {
            if (!n.is_string()) throw Error(where + ": expected a string");
            field(c) = *n.value<std::string>();
          },
          nullptr,
          {},
          default_text.empty() ? quoted(default_of(field)) : default_text,
          std::move(meaning)};
}

// "\"sync\" or \"async\""
std::string choice_list(const std::vector<std::string>& choices, bool markdown) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    const char* sep = i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
    const std::string q = "\"" + choices[i] + "\"";
    list += sep + (markdown ? "`" + q + "`" : q);
  }
  return list;
}

// Where the string in `n` stands in `choices`; else an error that lists them.
size_t choice_index(const toml::node& n, const std::string& where,
                    const std::vector<std::string>& choices) {
  auto v = n.value<std::string>();
  auto it = v ? std::find(choices.begin(), choices.end(), *v) : choices.end();
  if (!n.is_string() || it == choices.end())
    throw Error(where + ": expected " + choice_list(choices, false));
  return size_t(it - choices.begin());
}

// A string that must be one of `choices`, or an enum written as its `name` (one of `values`).
Key choice_key(std::string name, std::vector<std::string> choices,
               std::function<void(Config&, size_t)> assign, std::string default_name,
               std::string meaning) {
  std::string doc = choice_list(choices, true) + (meaning.empty() ? "" : ": " + meaning);
  return {std::move(name),
          "string",
          [choices, assign](Config& c, const toml::node& n, const std::string& where) {
            assign(c, choice_index(n, where, choices));
          },
          nullptr,
          {},
          quoted(default_name),
          std::move(doc)};
}
template <class F>
Key string_choice_key(std::string name, F field, std::vector<std::string> choices,
                      std::string meaning) {
  auto assign = [field, choices](Config& c, size_t i) { field(c) = choices[i]; };
  return choice_key(std::move(name), choices, assign, default_of(field), std::move(meaning));
}
// A list of integers, each in `range`, at most `max_len` of them.
template <class F>
Key int_list_key(std::string name, F field, Range range, size_t max_len, std::string meaning) {
  return {std::move(name),
          "int list",
          [field, range, max_len](Config& c, const toml::node& n, const std::string& where) {
            const toml::array* a = n.as_array();
            if (!a) throw Error(where + ": expected a list of integers, as [2, 2]");
            if (a->size() > max_len)
              throw Error(fmt::format("{}: at most {} entries, got {}", where, max_len, a->size()));
            std::vector<int64_t> v;
            for (const toml::node& e : *a) {
              auto x = integer_in(e);
              if (!x) throw Error(where + ": expected a list of integers, as [2, 2]");
              if (!range.contains(double(*x)))
                throw Error(fmt::format("{}: each entry must be in {}, got {}", where,
                                        range_text(range), *x));
              v.push_back(*x);
            }
            field(c) = std::move(v);
          },
          nullptr,
          range,
          "none",
          std::move(meaning)};
}

template <class F, class E>
Key enum_key(std::string name, F field, std::vector<E> values, const char* (*spell)(E),
             std::string meaning) {
  std::vector<std::string> names;
  for (E v : values) names.push_back(spell(v));
  auto assign = [field, values](Config& c, size_t i) { field(c) = values[i]; };
  return choice_key(std::move(name), names, assign, spell(default_of(field)), std::move(meaning));
}

template <class K>
std::vector<std::string> names_of(const std::vector<K>& keys) {
  std::vector<std::string> r;
  for (const auto& k : keys) r.push_back(k.name);
  return r;
}
template <class K>
const K* find_named(const std::vector<K>& keys, const std::string& name) {
  for (const auto& k : keys)
    if (k.name == name) return &k;
  return nullptr;
}

using L = models::ModelLimits;

// [model] moe = { experts = 8, top_k = 2, ... }: an inline table of models::MoeConfig's keys.
const std::vector<Key>& moe_keys() {
  static const std::vector<Key> keys = {
      int_key(
          "experts", [](Config& c) -> int64_t& { return c.model.moe.experts; },
          closed(0, L::experts), "the number of experts (0: a dense model)"),
      int_key(
          "top_k", [](Config& c) -> int64_t& { return c.model.moe.top_k; }, at_least(1),
          "experts per token, at most `experts`"),
      int_key(
          "every", [](Config& c) -> int64_t& { return c.model.moe.every; }, at_least(1),
          "every `every`-th layer is MoE; at most `n_layers`"),
      float_key(
          "capacity_factor", [](Config& c) -> double& { return c.model.moe.capacity_factor; },
          above(0), "slots per expert and sequence: ceil(factor T k / E)"),
      bool_key(
          "dropless", [](Config& c) -> bool& { return c.model.moe.dropless; },
          "capacity T: no token dropped"),
      float_key(
          "aux_loss", [](Config& c) -> double& { return c.model.moe.aux_loss; }, at_least(0),
          "the load-balancing loss's weight"),
      float_key(
          "z_loss", [](Config& c) -> double& { return c.model.moe.z_loss; }, at_least(0),
          "the router z-loss's weight"),
      string_choice_key(
          "balance", [](Config& c) -> std::string& { return c.model.moe.balance; },
          {"model", "layer"}, "over all MoE layers' tokens together, or per layer"),
  };
  return keys;
}

Key moe_key() {
  return {"moe",
          "inline table",
          [](Config& c, const toml::node& n, const std::string& where) {
            const auto& keys = moe_keys();
            const toml::table* t = n.as_table();
            if (!t) throw Error(where + ": expected a table { experts = ..., top_k = ..., ... }");
            c.model.moe = models::MoeConfig{};
            for (const auto& [k, v] : *t) {
              const std::string key(k.str());
              const Key* it = find_named(keys, key);
              if (!it)
                throw Error(fmt::format("{}: unknown key '{}'", where, key),
                            suggest(key, names_of(keys)));
              it->set(c, v, where + "." + key);
            }
          },
          nullptr,
          {},
          "none (dense)",
          "Mixture-of-Experts MLPs: the `moe.` keys"};
}

// [plan] mesh = { data = 2, model = 2 }: axis sizes, in the order written.
Key mesh_key() {
  return {"mesh",
          "table of ints",
          [](Config& c, const toml::node& n, const std::string& where) {
            const toml::table* t = n.as_table();
            if (!t || t->empty())
              throw Error(where + ": expected a table of axis sizes",
                          "mesh = { data = 2, model = 2 }");
            // toml++ keeps keys sorted; the mesh keeps the order they were written in
            std::vector<std::pair<toml::source_position, std::pair<std::string, int64_t>>> axes;
            for (const auto& [k, v] : *t) {
              auto size = integer_in(v);
              if (!size)
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
          },
          nullptr,
          {},
          "none (one process)",
          "axis = size, each >= 1, at most 2^24 devices in all"};
}

// The tactics key's meaning, from the tactic table: "`{ kind, axis }`: data, fsdp, ...;
// `{ kind = "shard", pattern, dim, axis }` (docs/plans.md)".
std::string tactics_help() {
  std::string plain, patterned;
  for (const shard::TacticDef& d : shard::tactic_defs())
    if (d.takes_pattern)
      patterned += fmt::format(" `{{ kind = \"{}\", pattern, dim, axis }}`", d.name);
    else
      plain += fmt::format("{}{}", plain.empty() ? "" : ", ", d.name);
  return fmt::format("`{{ kind, axis }}`: {};{} (docs/plans.md)", plain, patterned);
}

// [plan] tactics = [ { kind = "fsdp", axis = "data" }, ... ]
Key tactics_key() {
  return {"tactics",
          "array of tables",
          [](Config& c, const toml::node& n, const std::string& where) {
            const toml::array* a = n.as_array();
            if (!a)
              throw Error(where + ": expected an array of tables",
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
                if (key == "kind")
                  tac.kind = str();
                else if (key == "axis")
                  tac.axis = str();
                else if (key == "pattern")
                  tac.pattern = str();
                else if (key == "dim") {
                  if (!v.is_integer()) throw Error(fmt::format("{}: dim must be an integer", at));
                  tac.dim = *v.value<int64_t>();
                } else {
                  throw Error(fmt::format("{}: unknown key '{}'", at, key),
                              suggest(key, {"kind", "axis", "pattern", "dim"}));
                }
              }
              const shard::TacticDef* def = shard::find_tactic(tac.kind);
              if (!def)
                throw Error(fmt::format("{}: unknown tactic kind '{}'", at, tac.kind),
                            suggest(tac.kind, shard::tactic_kinds()));
              if (tac.axis.empty()) throw Error(at + ": missing key 'axis'");
              if (def->takes_pattern && (tac.pattern.empty() || tac.dim < 0))
                throw Error(fmt::format("{}: a {} tactic needs pattern and dim", at, def->name),
                            "{ kind = \"shard\", pattern = \"lm_head.weight\", dim = 0, axis = "
                            "\"model\" }");
              if (!def->takes_pattern && (!tac.pattern.empty() || tac.dim >= 0))
                throw Error(fmt::format("{}: a {} tactic takes no pattern or dim", at, def->name),
                            "only { kind = \"shard\", pattern, dim, axis } reads them");
              c.plan.plan.tactics.push_back(tac);
            }
          },
          nullptr,
          {},
          "none",
          tactics_help()};
}

struct Section {
  std::string name;
  std::vector<Key> keys;
};

const std::vector<Section>& schema() {
  using Bucket = passes::ScheduleOptions::Bucket;
  using Recompute = passes::ScheduleOptions::Recompute;
  static const std::vector<Section> s = {
      {"model",
       {
           string_key(
               "arch", [](Config& c) -> std::string& { return c.model.arch; },
               "`\"llama\"` or `\"gpt2\"`", "required"),
           int_key(
               "vocab_size", [](Config& c) -> int64_t& { return c.model.vocab_size; },
               closed(1, L::vocab_size), ">= 256 for byte-level text"),
           int_key(
               "d_model", [](Config& c) -> int64_t& { return c.model.d_model; },
               closed(1, L::d_model), "a multiple of n_heads"),
           int_key(
               "n_layers", [](Config& c) -> int64_t& { return c.model.n_layers; },
               closed(1, L::n_layers), "deeper graphs cost the memory planner minutes"),
           int_key(
               "n_heads", [](Config& c) -> int64_t& { return c.model.n_heads; }, at_least(1),
               "divides d_model"),
           int_key(
               "n_kv_heads", [](Config& c) -> int64_t& { return c.model.n_kv_heads; }, at_least(0),
               "divides n_heads (Llama's grouped-query attention; GPT-2 has none)",
               "0 (= n_heads)"),
           int_key(
               "ffn_hidden", [](Config& c) -> int64_t& { return c.model.ffn_hidden; },
               closed(0, L::ffn_hidden), "the MLP's width",
               "0 (Llama: 8/3 d rounded up to 16; GPT-2: 4 d)"),
           int_key(
               "max_seq_len", [](Config& c) -> int64_t& { return c.model.max_seq_len; },
               closed(1, L::max_seq_len), "at least `[train] seq_len`"),
           float_key(
               "norm_eps", [](Config& c) -> double& { return c.model.norm_eps; }, above(0), ""),
           float_key(
               "rope_theta", [](Config& c) -> double& { return c.model.rope_theta; }, above(0),
               "Llama's rotary base"),
           bool_key(
               "tie_embeddings", [](Config& c) -> bool& { return c.model.tie_embeddings; },
               "the head reuses the token embedding (Llama; GPT-2's is always tied)"),
           choice_key(
               "dtype", {"f32", "bf16"},
               [](Config& c, size_t i) { parse_dtype(i == 0 ? "f32" : "bf16", &c.model.dtype); },
               "f32", "compute; weights and moments stay f32"),
           bool_key(
               "normformer", [](Config& c) -> bool& { return c.model.normformer; },
               "NormFormer's post-attention norm, head scales and post-activation norm"),
           // not a ModelConfig field: where the starting weights come from (loom export, init)
           string_key(
               "init", [](Config& c) -> std::string& { return c.init_weights; },
               "starting weights: a `.safetensors` file or a directory (`loom export`, a "
               "checkpoint, a Hugging Face model, whose config.json then fills `[model]`)"),
           moe_key(),
       }},
      {"train",
       {
           int_key(
               "batch_size", [](Config& c) -> int64_t& { return c.train.batch_size; },
               closed(1, 1 << 20), "rows per micro-batch (the global batch under a plan)"),
           int_key(
               "seq_len", [](Config& c) -> int64_t& { return c.train.seq_len; },
               closed(1, L::max_seq_len), "at most `[model] max_seq_len`"),
           int_key(
               "seed", [](Config& c) -> int64_t& { return c.train.seed; }, any_value(),
               "initialisation and data sampling"),
           int_key(
               "steps", [](Config& c) -> int64_t& { return c.train.steps; },
               closed(1, std::ldexp(1.0, 40)), ""),
           int_key(
               "warmup_steps", [](Config& c) -> int64_t& { return c.train.warmup_steps; },
               at_least(0), "linear warmup, then cosine to min_lr"),
           float_key(
               "min_lr", [](Config& c) -> double& { return c.train.min_lr; }, at_least(0),
               "at most `[optim] lr`"),
           int_key(
               "eval_every", [](Config& c) -> int64_t& { return c.train.eval_every; }, at_least(0),
               "steps between evaluations (0: at the end only)"),
           int_key(
               "eval_batches", [](Config& c) -> int64_t& { return c.train.eval_batches; },
               closed(1, 1 << 20), ""),
           int_key(
               "grad_accum", [](Config& c) -> int64_t& { return c.train.grad_accum; },
               closed(1, 1 << 20), "micro-batches per optimizer step"),
           choice_key(
               "device", {"cpu", "cuda"},
               [](Config& c, size_t i) {
                 c.train.device = i == 0 ? runtime::DeviceKind::cpu : runtime::DeviceKind::cuda;
               },
               "cpu",
               "where steps run (`train` with its evaluation, `step`, `bench`; `sample`'s "
               "default, which `--device` overrides); cuda: GPU 0, in a build of the cuda preset; "
               "checkpoints are the same either way"),
       }},
      {"optim",
       {
           float_key(
               "lr", [](Config& c) -> double& { return c.optim.lr; }, at_least(0), ""),
           float_key(
               "beta1", [](Config& c) -> double& { return c.optim.beta1; }, below_one(), ""),
           float_key(
               "beta2", [](Config& c) -> double& { return c.optim.beta2; }, below_one(), ""),
           float_key(
               "eps", [](Config& c) -> double& { return c.optim.eps; }, above(0), ""),
           float_key(
               "weight_decay", [](Config& c) -> double& { return c.optim.weight_decay; },
               at_least(0), "decoupled (AdamW); not on norms and biases"),
           float_key(
               "grad_clip", [](Config& c) -> double& { return c.optim.grad_clip; }, at_least(0),
               "the global gradient norm's limit (0: no clipping)"),
       }},
      {"data",
       {
           string_key(
               "path", [](Config& c) -> std::string& { return c.data.path; },
               "a text file, a directory of `.txt` files, or a `loom data prepare` "
               "directory"),
       }},
      {"checkpoint",
       {
           int_key(
               "every", [](Config& c) -> int64_t& { return c.checkpoint.every; }, at_least(0),
               "steps between checkpoints (0: at the end only)"),
           int_key(
               "keep", [](Config& c) -> int64_t& { return c.checkpoint.keep; }, at_least(0),
               "checkpoints kept (0: all)"),
       }},
      {"plan",
       {
           mesh_key(),
           tactics_key(),
           string_choice_key(
               "ranks", [](Config& c) -> std::string& { return c.plan.ranks; }, {"mpi", "local"},
               "one process per rank (under mpirun), or threads of one process"),
       }},
      {"passes",
       {
           bool_key(
               "reshard_after_forward",
               [](Config& c) -> bool& { return c.passes.reshard_after_forward; },
               "false: each parameter gathered once per step"),
           bool_key(
               "cast_before_gather", [](Config& c) -> bool& { return c.passes.cast_before_gather; },
               "bf16: weights cast before their all-gather"),
           enum_key(
               "recompute", [](Config& c) -> Recompute& { return c.passes.recompute; },
               {Recompute::none, Recompute::selective, Recompute::selective_op, Recompute::full},
               passes::recompute_name, "activation checkpointing (`selective_op`: torchtitan's)"),
           enum_key(
               "bucket", [](Config& c) -> Bucket& { return c.passes.bucket; },
               {Bucket::none, Bucket::block, Bucket::automatic}, passes::bucket_name,
               "`auto`: sized by the simulator on `cluster`"),
           float_key(
               "bucket_mb", [](Config& c) -> double& { return c.passes.bucket_mb; },
               {0, 1e6, true, false}, ""),
           string_key(
               "cluster", [](Config& c) -> std::string& { return c.passes.cluster_file; },
               "the cluster file `bucket = \"auto\"` predicts on"),
           bool_key(
               "prefetch", [](Config& c) -> bool& { return c.passes.prefetch; },
               "collectives on a communication thread, started early"),
           int_key(
               "max_in_flight", [](Config& c) -> int64_t& { return c.passes.max_in_flight; },
               at_least(1), "prefetched collectives at once"),
       }},
      {"outer",
       {
           string_key(
               "server", [](Config& c) -> std::string& { return c.outer.server; },
               "host:port of `loom outer-server`; set, `loom train` runs as an island"),
           enum_key(
               "mode", [](Config& c) -> OuterMode& { return c.outer.mode; },
               {OuterMode::sync, OuterMode::async}, outer_mode_name,
               "DiLoCo's rounds, or Delayed Nesterov"),
           string_choice_key(
               "compress", [](Config& c) -> std::string& { return c.outer.compress; },
               {"f32", "bf16", "int8", "int4"},
               "pseudo-gradients pushed as (int8, int4: a scale per block of 64; the "
               "server sums in f32)"),
           // H travels to and from the outer server as a u32
           int_key(
               "inner_steps", [](Config& c) -> int64_t& { return c.outer.inner_steps; },
               closed(1, std::ldexp(1.0, 31) - 1), "H, inner steps between pushes"),
           float_key(
               "lr", [](Config& c) -> double& { return c.outer.lr; }, {0, 1e3, true, false},
               "the outer Nesterov learning rate"),
           float_key(
               "momentum", [](Config& c) -> double& { return c.outer.momentum; }, below_one(), ""),
           int_key(
               "fragments", [](Config& c) -> int64_t& { return c.outer.fragments; },
               closed(1, 4096),
               "streaming DiLoCo: the model's fragments (strided by layer), each synced every "
               "inner_steps at staggered offsets (sync mode)"),
           int_key(
               "overlap", [](Config& c) -> int64_t& { return c.outer.overlap; }, at_least(0),
               "streaming DiLoCo: inner steps an island goes on after pushing a fragment before it "
               "takes the round's result (less than inner_steps / fragments)"),
           float_key(
               "mix", [](Config& c) -> double& { return c.outer.mix; }, closed(0, 1),
               "streaming DiLoCo: a fragment's parameters after its round: mix x local + (1 - mix) "
               "x global (0: the global ones)"),
           int_list_key(
               "modules", [](Config& c) -> std::vector<int64_t>& { return c.outer.modules; },
               closed(1, 64), 8,
               "DiPaCo: modules per level, as [2, 2] (the blocks cut into that many levels; a "
               "path takes one module per level); sync mode, one fragment"),
           int_key(
               "path", [](Config& c) -> int64_t& { return c.outer.path; }, closed(0, 4095),
               "DiPaCo: the path this island trains (less than the product of modules)"),
           string_key(
               "router", [](Config& c) -> std::string& { return c.outer.router; },
               "DiPaCo: the directory `loom dipaco route` wrote (`loom islands` gives island i "
               "path i mod paths, and that path's data)"),
           int_key(
               "delay", [](Config& c) -> int64_t& { return c.outer.delay; }, at_least(0),
               "async Delayed Nesterov period (0: the islands that are members at each push)"),
           float_key(
               "grace", [](Config& c) -> double& { return c.outer.grace; }, closed(0, 10),
               "async: after a push, the longest an island waits for the rest of its Delayed "
               "Nesterov "
               "period before it pulls, as a fraction of its round's time (0: "
               "never waits)"),
           int_key(
               "islands", [](Config& c) -> int64_t& { return c.outer.islands; }, at_least(0),
               "islands expected (the first round waits for them; async step budget)"),
           // durations become clock ticks (nanoseconds in int64: at most 292 years); a day is
           // plenty
           float_key(
               "lease_s", [](Config& c) -> double& { return c.outer.lease_s; },
               {0, 86400, true, false}, "an island silent this long is dropped"),
           float_key(
               "retry_s", [](Config& c) -> double& { return c.outer.retry_s; }, closed(0, 86400),
               "how long an island keeps reconnecting"),
           string_key(
               "token_file", [](Config& c) -> std::string& { return c.outer.token_file; },
               "a file holding the shared token (else `LOOM_OUTER_TOKEN`)"),
           string_key(
               "tls_ca", [](Config& c) -> std::string& { return c.outer.tls_ca; },
               "island: the PEM certificate to trust"),
           string_key(
               "tls_cert", [](Config& c) -> std::string& { return c.outer.tls_cert; },
               "server: its PEM certificate (with tls_key)"),
           string_key(
               "tls_key", [](Config& c) -> std::string& { return c.outer.tls_key; },
               "server: its PEM private key (with tls_cert)"),
       }},
  };
  return s;
}

// Every key with its "[section] key" name, the inline table's as "[model] moe.<key>".
template <class F>
void for_each_key(F f) {
  for (const Section& sec : schema())
    for (const Key& k : sec.keys) {
      f(sec.name, k.name, k);
      if (sec.name == "model" && k.name == "moe")
        for (const Key& m : moe_keys()) f(sec.name, "moe." + m.name, m);
    }
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
    if (!mine || ((key == "ffn_hidden" || key == "n_kv_heads") && integer_in(*mine) == 0)) {
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
  for_each_key([&](const std::string& section, const std::string& name, const Key&) {
    out.push_back(fmt::format("[{}] {}", section, name));
  });
  return out;
}

std::string config_reference() {
  std::string out;
  for (const Section& sec : schema()) {
    out += fmt::format(
        "\n## `[{}]`\n\n| key | type | default | range and meaning |\n"
        "| --- | --- | --- | --- |\n",
        sec.name);
    for_each_key([&](const std::string& section, const std::string& name, const Key& k) {
      if (section != sec.name) return;
      std::string doc = range_text(k.range);
      if (!doc.empty()) doc = "`" + doc + "`";
      if (!k.meaning.empty()) doc += (doc.empty() ? "" : ": ") + k.meaning;
      out +=
          fmt::format("| `[{}] {}` | {} | {} | {} |\n", section, name, k.type, k.default_text, doc);
    });
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
    const Section* sit = find_named(sch, section);
    if (!sit)
      throw Error(fmt::format("{}: unknown section [{}]", path, section),
                  suggest(section, names_of(sch)));
    const toml::table* t = sv.as_table();
    if (!t) throw Error(fmt::format("{}: [{}] must be a table", path, section));
    for (const auto& [kk, kv] : *t) {
      std::string key(kk.str());
      const Key* kit = find_named(sit->keys, key);
      if (!kit)
        throw Error(fmt::format("{}: unknown key '{}' in [{}]", path, key, section),
                    suggest(key, names_of(sit->keys)));
      kit->set(c, kv, fmt::format("{}: [{}] {}", path, section, key));
      if (section == "model" && key == "arch") have_arch = true;
      written.insert(fmt::format("[{}] {}", section, key));
    }
  }
  if (!have_arch)
    throw Error(fmt::format("{}: missing key 'arch' in [model]", path),
                "add [model] arch = \"llama\" or \"gpt2\"");
  // key: "[section] key". A key the user never wrote holds its default: the message says so.
  auto bad = [&](const std::string& key, const std::string& why) {
    if (written.count(key)) throw Error(fmt::format("{}: {}: {}", path, key, why));
    throw Error(fmt::format("{}: {}: {} (that is its default value: the file does not set it)",
                            path, key, why),
                fmt::format("set {} in the config, or with --set", key));
  };
  // every numeric key in its range (the schema's), whoever set it
  for_each_key([&](const std::string& section, const std::string& name, const Key& k) {
    if (!k.out_of_range) return;
    if (const std::string why = k.out_of_range(c); !why.empty())
      bad(fmt::format("[{}] {}", section, name), why);
  });
  c.model.validate(path);
  c.model.source = path;
  if (use == ConfigUse::model_only) return c;
  // the rules that involve two keys (each key's own range is the schema's)
  if (c.train.seq_len > c.model.max_seq_len)
    bad("[train] seq_len", fmt::format("exceeds [model] max_seq_len = {}", c.model.max_seq_len));
  if (c.outer.mode == OuterMode::async && (c.outer.fragments > 1 || c.outer.overlap > 0))
    bad(c.outer.fragments > 1 ? "[outer] fragments" : "[outer] overlap",
        "streaming DiLoCo needs [outer] mode = \"sync\"");
  if (c.outer.inner_steps % c.outer.fragments != 0)
    bad("[outer] fragments",
        fmt::format("must divide [outer] inner_steps = {} (one fragment is pushed every "
                    "inner_steps / fragments steps), got {}",
                    c.outer.inner_steps, c.outer.fragments));
  if (c.outer.overlap > 0 && c.outer.overlap >= c.outer.inner_steps / c.outer.fragments)
    bad("[outer] overlap",
        fmt::format("must be less than [outer] inner_steps / fragments = {} (one fragment in "
                    "flight at a time), got {}",
                    c.outer.inner_steps / c.outer.fragments, c.outer.overlap));
  if (!c.outer.modules.empty()) {
    const char* rule = "DiPaCo ([outer] modules) needs mode = \"sync\", one fragment, no overlap";
    if (c.outer.mode != OuterMode::sync) bad("[outer] mode", rule);
    if (c.outer.fragments != 1) bad("[outer] fragments", rule);
    if (c.outer.overlap != 0) bad("[outer] overlap", rule);
    int64_t paths = 1;
    for (int64_t m : c.outer.modules)
      if ((paths *= m) > 4096)
        bad("[outer] modules", "more than 4096 paths (the product of the modules per level)");
  }
  if (c.outer.path >= std::max<int64_t>(c.outer.paths(), 1))
    bad("[outer] path",
        c.outer.modules.empty()
            ? fmt::format("{}: a DiPaCo path needs [outer] modules", c.outer.path)
            : fmt::format("must be less than the {} paths of [outer] modules, got {}",
                          c.outer.paths(), c.outer.path));
  if (!c.outer.router.empty() && c.outer.modules.empty())
    bad("[outer] router", "a DiPaCo router needs [outer] modules");
  if (c.train.min_lr > c.optim.lr)
    bad("[train] min_lr",
        fmt::format("must be at most [optim] lr = {} (the schedule decays to it), "
                    "got {}",
                    c.optim.lr, c.train.min_lr));
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
