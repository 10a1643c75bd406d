// loom inspect: print a model's graph as IR text at a stage of the pipeline.
#include <fmt/format.h>

#include "commands.h"
#include "loom/autodiff/autodiff.h"
#include "loom/core/error.h"
#include "loom/ir/text.h"
#include "loom/train/config.h"

namespace loom::cli {

std::function<int()> add_inspect(CLI::App& app) {
  struct Opts {
    std::string config, stage = "forward";
    std::vector<std::string> sets;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand("inspect", "print the graph as IR text");
  s->add_option("config", o->config, "config TOML")->required();
  s->add_option("--stage", o->stage, "forward | train")->check(CLI::IsMember({"forward", "train"}));
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  return [o]() {
    train::Config cfg = train::load_config(o->config, o->sets);
    models::ModelGraph m = models::build_model(cfg.model, cfg.train.batch_size, cfg.train.seq_len);
    if (o->stage == "forward") m.graph.add_output(m.loss);
    else autodiff::build_train_step(m.graph, m.loss, cfg.optim);
    fmt::print("{}", ir::print(m.graph));
    return 0;
  };
}

}  // namespace loom::cli
