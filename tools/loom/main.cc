// loom: the command-line entry point. Catches loom::Error once, prints it, exits 1.
//
// Built twice (CMakeLists.txt): `loom` runs every command but data and sample, which it hands to
// `loom-text` beside it (same arguments); loom-text (LOOM_TEXT_TOOLS) runs only those two.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "commands.h"
#include "loom/core/error.h"

namespace {

#ifndef LOOM_TEXT_TOOLS
// `loom data ...` / `loom sample ...`: replaces this process with loom-text from the same
// directory.
[[noreturn]] void run_text_tools(char** argv) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string path = (ec ? std::filesystem::path(argv[0]) : self).parent_path() / "loom-text";
  ::execv(path.c_str(), argv);
  std::fprintf(stderr, "loom: error: cannot run %s (the data and sample commands): %s\n",
               path.c_str(), std::strerror(errno));
  std::exit(1);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  // A write past a file-size limit then fails with EFBIG, reported like any failed write, instead
  // of killing the process mid-checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"Loom: train transformer language models on one machine or many"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, std::function<int()>>> cmds;
  auto add = [&](std::function<int()> (*f)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto run = f(app);
    cmds.push_back({app.get_subcommands({})[before], run});
  };
#ifdef LOOM_TEXT_TOOLS
  add(loom::cli::add_data);
  add(loom::cli::add_sample);
#else
  if (argc > 1 && (std::strcmp(argv[1], "data") == 0 || std::strcmp(argv[1], "sample") == 0))
    run_text_tools(argv);
  // listed in --help; never parsed here
  app.add_subcommand("data", "prepare a corpus: train a BPE tokenizer and write token shards");
  app.add_subcommand("sample", "generate text from a trained run");
  add(loom::cli::add_train);
  add(loom::cli::add_report);
  add(loom::cli::add_export);
  add(loom::cli::add_step);
  add(loom::cli::add_bench);
  add(loom::cli::add_inspect);
  add(loom::cli::add_plan);
  add(loom::cli::add_calibrate);
  add(loom::cli::add_outer_server);
  add(loom::cli::add_islands);
  add(loom::cli::add_config);
  add(loom::cli::add_dipaco);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : cmds) {
    if (!sub->parsed()) continue;
    const std::string name = sub->get_name();
    try {
      return run();
    } catch (const loom::Error& e) {
      std::fprintf(stderr, "loom: error: %s\n", e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "loom %s: error: out of memory\n", name.c_str());
      return 1;
    } catch (const std::exception& e) {
      // the last guard: every reader and writer turns bad input into a loom::Error naming the
      // file and key at its cause; what still arrives here is a defect, said as one
      std::fprintf(stderr,
                   "loom %s: error: unexpected failure: %s\nhint: this is a bug in loom; please "
                   "report it with the command line and its input files\n",
                   name.c_str(), e.what());
      return 1;
    } catch (...) {
      std::fprintf(stderr, "loom %s: error: unexpected failure (not a std::exception)\n",
                   name.c_str());
      return 1;
    }
  }
  return 0;
}
