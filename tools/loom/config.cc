// loom config: check a config and print it resolved (overrides applied, every key the loader
// understood), or print the key reference.
//
//   loom config CONFIG [--set section.key=value ...]   exit 0 and the resolved TOML, or the error
//   loom config --keys                                  every key: type, default, range, meaning
#include "loom/train/config.h"

#include <fmt/format.h>

#include "commands.h"
#include "loom/core/error.h"

namespace loom::cli {

std::function<int()> add_config(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> sets;
    bool keys = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "config", "check a config and print it resolved, or print every key (--keys)");
  s->add_option("config", o->config, "config TOML");
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  s->add_flag("--keys", o->keys,
              "print every key with its type, default, range and meaning (markdown)");
  return [o]() {
    if (o->keys) {
      fmt::print("{}", train::config_reference());
      return 0;
    }
    if (o->config.empty())
      throw Error("loom config: a config is required",
                  "loom config CONFIG.toml [--set section.key=value], or loom config --keys");
    fmt::print("{}", train::load_config(o->config, o->sets).text);
    return 0;
  };
}

}  // namespace loom::cli
