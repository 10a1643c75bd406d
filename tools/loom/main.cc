// loom: the command-line entry point. Catches loom::Error once, prints it, exits 1.
#include <csignal>
#include <cstdio>
#include <exception>
#include <vector>

#include "commands.h"
#include "loom/core/error.h"

int main(int argc, char** argv) {
  // A write past a file-size limit then fails with EFBIG, reported like any failed write, instead of
  // killing the process mid-checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"Loom: train transformer language models on one machine or many"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, std::function<int()>>> cmds;
  auto add = [&](std::function<int()> (*f)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto run = f(app);
    cmds.push_back({app.get_subcommands({})[before], run});
  };
  add(loom::cli::add_data);
  add(loom::cli::add_train);
  add(loom::cli::add_sample);
  add(loom::cli::add_report);
  add(loom::cli::add_export);
  add(loom::cli::add_step);
  add(loom::cli::add_bench);
  add(loom::cli::add_inspect);
  add(loom::cli::add_outer_server);
  add(loom::cli::add_islands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : cmds)
      if (sub->parsed()) return run();
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "loom: error: out of memory\n");
    return 1;
  }
  return 0;
}
