// loom islands: DiLoCo (and DiPaCo) on one machine: an outer server and N training islands as
// processes over loopback. The work is outer/islands.h's (the run directory's layout, the token,
// threads, DiPaCo's paths); this file parses the flags and prints the result.
#include "loom/outer/islands.h"

#include <fmt/format.h>

#include <filesystem>

#include "commands.h"

namespace loom::cli {

std::function<int()> add_islands(CLI::App& app) {
  struct Opts {
    outer::IslandsOptions run;
    std::vector<std::string> slow, stall;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "islands", "run an outer server and N training islands on this machine (DiLoCo, async)");
  s->add_option("config", o->run.config, "config TOML with an [outer] section")->required();
  s->add_option("--islands", o->run.islands, "number of islands")->check(whole_number(1, 256));
  s->add_option("--run-dir", o->run.run_dir, "default runs/<config>-islands");
  s->add_option("--slow", o->slow,
                "I=F: island I takes F times as long per step (loom train --slowdown)");
  s->add_option("--stall", o->stall,
                "I=STEP:SECONDS: island I sleeps that long once before that step (loom train "
                "--stall)");
  s->add_option("--set", o->run.sets,
                "override a config key of server and islands: section.key=value");
  return [o]() {
    outer::IslandsOptions run = o->run;
    run.slowdown = outer::parse_slowdowns(o->slow, run.islands);
    run.stalls = outer::parse_stalls(o->stall, run.islands);
    run.loom_binary = std::filesystem::read_symlink("/proc/self/exe").string();
    run.progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
    const outer::IslandsResult r = outer::run_islands(run);
    const nlohmann::json& s = r.summary;
    fmt::print(
        "{} islands, {} mode, H = {}: global parameters at version {}: val loss {:.4f}; "
        "{} bytes sent, {} received; {:.1f} s; {}/summary.json\n",
        run.islands, s["mode"].get<std::string>(), s["inner_steps"].get<int64_t>(),
        s["version"].get<uint64_t>(), s["val_loss"].get<double>(), s["bytes_sent"].get<uint64_t>(),
        s["bytes_received"].get<uint64_t>(), s["wall_s"].get<double>(), r.run_dir);
    return 0;
  };
}

}  // namespace loom::cli
