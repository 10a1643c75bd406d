// loom step: one forward and backward on given weights and tokens; writes the loss, every
// parameter's gradient under its Hugging Face name and, with --logits, the logits. The door for
// checking Loom against any other implementation. It reads only the config's [model]: the batch and
// sequence length come from the tokens file.
#include "loom/train/step.h"

#include <fmt/format.h>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"

namespace loom::cli {

std::function<int()> add_step(CLI::App& app) {
  struct Opts {
    std::string config, weights, tokens, out;
    std::vector<std::string> sets;
    bool logits = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand("step", "one forward+backward: write loss and gradients");
  s->add_option("--config", o->config, "config TOML ([model] is used)")->required();
  s->add_option("--weights", o->weights, "weights (safetensors, Hugging Face names)")->required();
  s->add_option("--tokens", o->tokens, "safetensors with i32 'tokens' [B, T+1]")->required();
  s->add_option("--out", o->out, "output safetensors: loss and a gradient per parameter")
      ->required();
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  s->add_flag("--logits", o->logits, "also write the logits, f32 [B, T, vocab_size]");
  return [o]() {
    check_output("--out", o->out,
                 {{"--weights", o->weights}, {"--tokens", o->tokens}, {"--config", o->config}});
    train::Config cfg = train::load_config(o->config, o->sets, train::ConfigUse::model_only);
    SafetensorsFile tf = SafetensorsFile::open(o->tokens);
    if (!tf.contains("tokens"))
      throw Error(fmt::format("tokens {}: no tensor named 'tokens'", o->tokens));
    const TensorView& tv = tf.get("tokens");
    // B in [train] batch_size's range: no rows would make the loss a mean of nothing (NaN)
    if (tv.dtype != DType::i32 || tv.shape.size() != 2 || tv.shape[1] < 2 || tv.shape[0] < 1 ||
        tv.shape[0] > (int64_t(1) << 20))
      throw Error(
          fmt::format("tokens {}: 'tokens' is {}{}, expected i32 [B, T+1] with T >= 1 "
                      "and 1 <= B <= 2^20",
                      o->tokens, dtype_name(tv.dtype), shape_str(tv.shape)));
    cfg.train.batch_size = tv.shape[0];
    cfg.train.seq_len = tv.shape[1] - 1;
    if (cfg.train.seq_len > cfg.model.max_seq_len)
      throw Error(fmt::format("tokens {}: T = {} exceeds [model] max_seq_len = {} in {}", o->tokens,
                              cfg.train.seq_len, cfg.model.max_seq_len, o->config));
    const auto* ids = static_cast<const int32_t*>(tv.data);
    for (int64_t i = 0; i < numel(tv.shape); ++i)
      if (ids[i] < 0 || ids[i] >= cfg.model.vocab_size)
        throw Error(fmt::format("tokens {}: token {} at [{}, {}] is outside the vocabulary [0, {})",
                                o->tokens, ids[i], i / tv.shape[1], i % tv.shape[1],
                                cfg.model.vocab_size));
    train::ParamStore params(cfg.model);
    params.load(o->weights);
    train::StepRunner runner(cfg, params, train::StepRunner::Mode::grads);
    float loss = runner.step(ids);
    std::vector<TensorToWrite> out;
    out.push_back({"loss", DType::f32, {}, &loss});
    float ce_loss = runner.ce_loss();  // = loss unless an MoE model adds its auxiliary losses
    out.push_back({"ce_loss", DType::f32, {}, &ce_loss});
    for (const auto& p : params.infos())
      out.push_back({p.name, DType::f32, p.shape, runner.grad(p.name)});
    if (o->logits)
      out.push_back({"logits",
                     DType::f32,
                     {cfg.train.batch_size, cfg.train.seq_len, cfg.model.vocab_size},
                     runner.logits()});
    write_safetensors(o->out, out);
    fmt::print("loss {:.6f}\n", loss);
    return 0;
  };
}

}  // namespace loom::cli
