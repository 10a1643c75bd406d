#include "loom/train/memory.h"

#include <fmt/format.h>

#include <fstream>

#include "loom/core/error.h"

namespace loom::train {

namespace {

std::string gb(double b) { return fmt::format("{:.3g} GB", b / 1e9); }

}  // namespace

int64_t machine_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return int64_t(kb * 1024);
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

void check_params_fit(const models::ModelConfig& m, const std::string& source, int64_t memory) {
  if (memory <= 0) return;
  const double params = double(models::param_count(m)), bytes = params * 4;
  if (bytes <= double(memory)) return;
  throw Error(fmt::format("{}: the model's {:.4g} parameters need {} (f32), more than this "
                          "machine's {} of memory ([model] d_model = {}, n_layers = {}, "
                          "vocab_size = {}, ffn_hidden = {})",
                          source, params, gb(bytes), gb(double(memory)), m.d_model, m.n_layers,
                          m.vocab_size, m.ffn()),
              "make the model smaller, or plan it for a cluster with loom plan");
}

void check_step_fits(const Config& cfg, bool train, int64_t ranks, int64_t memory,
                     const std::string& memory_of) {
  if (memory <= 0) return;
  const models::ModelConfig& m = cfg.model;
  const double params = double(models::param_count(m));
  const double tokens = double(cfg.train.batch_size) * double(cfg.train.seq_len);
  const double state = params * (train ? 16 : 4);  // weights, and gradients + two moments
  const double acts = tokens * (double(m.n_layers) * double(m.d_model) + double(m.vocab_size)) * 4;
  const double per_rank = (state + acts) / double(std::max<int64_t>(ranks, 1));
  if (per_rank <= double(memory)) return;
  throw Error(
      fmt::format("{}: a {} step needs at least {} a rank ({:.4g} parameters: {} of weights{}; "
                  "activations of [train] batch_size = {} x seq_len = {} tokens: {}{}), more than "
                  "{} {} of memory",
                  cfg.path, train ? "training" : "forward", gb(per_rank), params, gb(state),
                  train ? ", gradients and AdamW moments" : "", cfg.train.batch_size,
                  cfg.train.seq_len, gb(acts),
                  ranks > 1 ? fmt::format("; all over {} ranks", ranks) : "", memory_of,
                  gb(double(memory))),
      "reduce [train] batch_size or seq_len, or the model ([model] d_model, n_layers, "
      "vocab_size); shard it with a [plan] (fsdp) over more ranks");
}

}  // namespace loom::train
