#include "loom/train/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/config/schema.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/models/architecture.h"
#include "loom/models/config_section.h"
#include "loom/passes/config_section.h"
#include "loom/shard/config_section.h"
#include "loom/train/hf_dir.h"

namespace loom::train {

namespace {

using namespace config;
using L = models::ModelLimits;

// This room's sections: [train], [optim], [checkpoint].
Section<TrainConfig> train_section() {
  using T = TrainConfig;
  return {"train",
          {
              int_key("batch_size", &T::batch_size, closed(1, 1 << 20),
                      "rows per micro-batch (the global batch under a plan)"),
              int_key("seq_len", &T::seq_len, closed(1, L::max_seq_len),
                      "at most `[model] max_seq_len`"),
              int_key("seed", &T::seed, closed(0, std::ldexp(1.0, 62)),
                      "initialisation and data sampling"),
              int_key("steps", &T::steps, closed(1, std::ldexp(1.0, 40)), ""),
              int_key("warmup_steps", &T::warmup_steps, closed(0, std::ldexp(1.0, 40)),
                      "linear warmup, then cosine to min_lr"),
              float_key("min_lr", &T::min_lr, at_least(0), "at most `[optim] lr`"),
              int_key("eval_every", &T::eval_every, at_least(0),
                      "steps between evaluations (0: at the end only)"),
              int_key("eval_batches", &T::eval_batches, closed(1, 1 << 20), ""),
              int_key("grad_accum", &T::grad_accum, closed(1, 1 << 20),
                      "micro-batches per optimizer step"),
              choice_key<T>(
                  "device", {"cpu", "cuda"},
                  [](T& t, size_t i) {
                    t.device = i == 0 ? runtime::DeviceKind::cpu : runtime::DeviceKind::cuda;
                  },
                  "cpu",
                  "where steps run (`train` with its evaluation, `step`, `bench`; `sample`'s "
                  "default, which `--device` overrides); cuda: GPU 0, in a build of the cuda "
                  "preset; checkpoints are the same either way"),
          },
          nullptr};
}

Section<autodiff::AdamWConfig> optim_section() {
  using O = autodiff::AdamWConfig;
  return {"optim",
          {
              float_key("lr", &O::lr, at_least(0), ""),
              float_key("beta1", &O::beta1, below_one(), ""),
              float_key("beta2", &O::beta2, below_one(), ""),
              float_key("eps", &O::eps, {0, 1, true, false}, ""),
              float_key("weight_decay", &O::weight_decay, at_least(0),
                        "decoupled (AdamW); not on norms and biases"),
              float_key("grad_clip", &O::grad_clip, at_least(0),
                        "the global gradient norm's limit (0: no clipping)"),
          },
          nullptr};
}

Section<CheckpointConfig> checkpoint_section() {
  using C = CheckpointConfig;
  return {"checkpoint",
          {
              int_key("every", &C::every, at_least(0),
                      "steps between checkpoints (0: at the end only)"),
              int_key("keep", &C::keep, at_least(0), "checkpoints kept (0: all)"),
              bool_key("async", &C::async,
                       "write each checkpoint on a thread of its own from a copy in memory while "
                       "training goes on (the copy: the checkpoint's size, per rank its blocks, "
                       "until written; the next checkpoint waits for it); a crash still leaves "
                       "the previous checkpoint the newest"),
          },
          nullptr};
}

// Inserts `key` into `sec` before the key named `before`.
void insert_before(Section<Config>& sec, const std::string& before, Key<Config> key) {
  auto at = std::find_if(sec.keys.begin(), sec.keys.end(),
                         [&](const Key<Config>& k) { return k.name == before; });
  sec.keys.insert(at, std::move(key));
}

// Every section of a config, in the order the reference lists them: each room's, seen through its
// field of Config, with the keys that are the run's rather than the room's.
const std::vector<Section<Config>>& sections() {
  static const std::vector<Section<Config>> s = [] {
    Section<Config> model = lift<Config>(models::model_section(), &Config::model);
    // not a ModelConfig field: where the starting weights come from (loom export, init)
    insert_before(model, "moe",
                  string_key("init", &Config::init_weights,
                             "starting weights: a `.safetensors` file or a directory (`loom "
                             "export`, a checkpoint, a Hugging Face model, whose config.json then "
                             "fills `[model]`)"));
    auto plan_of = [](Config& c) -> shard::Plan& { return c.plan.plan; };
    Section<Config> plan = lift<Config>(shard::plan_section(), plan_of);
    plan.keys.push_back(lift<Config>(
        string_choice_key("ranks", &PlanConfig::ranks, {"mpi", "local"},
                          "one process per rank (under mpirun), or threads of one process"),
        &Config::plan));
    return std::vector<Section<Config>>{
        model,
        lift<Config>(train_section(), &Config::train),
        lift<Config>(optim_section(), &Config::optim),
        lift<Config>(data::data_section(), &Config::data),
        lift<Config>(checkpoint_section(), &Config::checkpoint),
        plan,
        lift<Config>(passes::passes_section(), &Config::passes),
        lift<Config>(outer::outer_section(), &Config::outer),
    };
  }();
  return s;
}

// The rules that involve keys of two sections.
void check_across(const Config& c, const Written& w) {
  if (c.train.seq_len > c.model.max_seq_len)
    w.fail("[train] seq_len", fmt::format("exceeds [model] max_seq_len = {}", c.model.max_seq_len));
  if (c.train.min_lr > c.optim.lr)
    w.fail("[train] min_lr",
           fmt::format("must be at most [optim] lr = {} (the schedule decays to it), got {}",
                       c.optim.lr, c.train.min_lr));
  // a step's widest activation, rows x width elements, at most 2^44: with at most 1024 layers its
  // byte counts stay inside int64 (2^20 rows of 2^24 tokens of a 64-wide model wrapped loom plan's
  // peak memory to a negative number)
  const long double rows = (long double)c.train.batch_size * (long double)c.train.seq_len;
  const long double width = std::max<long double>(
      {(long double)c.model.d_model, (long double)c.model.vocab_size,
       (long double)c.model.ffn() * (c.model.moe.enabled() ? c.model.moe.top_k : 1)});
  if (rows * width > std::ldexp(1.0L, 44))
    w.fail("[train] batch_size",
           fmt::format("times [train] seq_len = {} is {:.3g} tokens a step, whose widest "
                       "activation ({:.3g} wide: d_model, vocab_size or the MLP) would hold more "
                       "than Loom's limit of 2^44 elements",
                       c.train.seq_len, double(rows), double(width)));
  // the async server's step budget, islands x steps, is a count its state keeps below 2^53
  if (c.outer.mode == outer::OuterMode::async &&
      double(c.outer.islands) * double(c.train.steps) > std::ldexp(1.0, 53))
    w.fail("[outer] islands",
           fmt::format("times [train] steps = {} is the async step budget, which must be at most "
                       "2^53, got {}",
                       c.train.steps, c.outer.islands));
}

// The resolved config as TOML, saved in run directories. Full float precision (0.9 prints as
// 0.90000000000000002): toml++'s relaxed mode rounds to six digits, which would change a learning
// rate like 0.123456789 in the run's saved config. The mesh in the order it was written, not
// toml++'s sorted order.
std::string config_text(const toml::table& root, const shard::Plan& plan) {
  std::ostringstream os;
  os << root;
  std::string text = os.str() + "\n";
  if (const toml::table* p = root["plan"].as_table(); p && p->contains("mesh")) {
    std::ostringstream m;
    if (const toml::table* mt = (*p)["mesh"].as_table()) m << *mt;
    std::string written = "{ ";
    for (size_t i = 0; i < plan.mesh.axes().size(); ++i) {
      const auto& [a, n] = plan.mesh.axes()[i];
      written += fmt::format("{}{} = {}", i ? ", " : "", a, n);
    }
    written += " }";
    size_t at = text.find("mesh = " + m.str());
    if (at != std::string::npos) text.replace(at + 7, m.str().size(), written);
  }
  return text;
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for_each_key(sections(), [&](const std::string& section, const Key<Config>& k) {
    out.push_back(fmt::format("[{}] {}", section, k.name));
  });
  return out;
}

std::string config_reference() { return reference(sections()); }

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
  const Written written = read(sections(), root, c, path);
  if (!written.has("[model] arch"))
    throw Error(fmt::format("{}: missing key 'arch' in [model]", path),
                "add [model] arch = " + choice_list(models::architecture_names(), false));
  check_ranges(sections(), c, written);
  c.model.validate(path);
  c.model.source = path;
  if (use == ConfigUse::model_only) return c;
  check_across(c, written);
  check_rules(sections(), c, written);
  c.plan.plan.where = fmt::format("{}: [plan]", path);
  c.text = config_text(root, c.plan.plan);
  return c;
}

}  // namespace loom::train
