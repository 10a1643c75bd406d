// loom report: turns a run directory's metrics.jsonl into one self-contained HTML page: a summary
// header, four inline SVG line plots against step (train/val loss, learning rate, tokens/s,
// gradient norm) and the run's config.toml.
//
// It does not read checkpoints, run JavaScript, or fetch anything: the page is one file with no
// external references, so it can be mailed or opened offline. Invariant: the output file is either
// the previous one or the complete new one (written to a temporary file, fsynced, then renamed),
// never half a page. The reading and rendering are src/loom/report/.
#include "loom/report/report.h"

#include <fmt/format.h>

#include <filesystem>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::cli {

namespace fs = std::filesystem;

namespace {

// A run's label on a comparison page: its directory's name, or for an island (runs/x/island_0) the
// name of the directory holding the islands.
std::string run_label(const std::string& run) {
  fs::path p = fs::path(run).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.rfind("island_", 0) == 0 && p.has_parent_path())
    name = p.parent_path().filename().string() + "/" + name;
  return name;
}

// The rows of RUN_DIR's metrics.jsonl; says on stderr how many lines it skipped (report.h).
std::vector<report::Row> read_rows(const std::string& metrics) {
  report::Metrics m = report::read_metrics(metrics);
  if (m.skipped)
    fmt::print(stderr, "{}: skipped {} line{} that {} not metrics (the first: {})\n", metrics,
               m.skipped, m.skipped > 1 ? "s" : "", m.skipped > 1 ? "are" : "is", m.first_skip);
  return std::move(m.rows);
}

}  // namespace

std::function<int()> add_report(CLI::App& app) {
  struct Opts {
    std::vector<std::string> run_dirs;
    std::string out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "report", "write an HTML page of a run's metrics and config, or compare several runs");
  s->add_option("run_dir", o->run_dirs, "run directories of loom train runs (several: compared)")
      ->required();
  s->add_option("--out", o->out,
                "the HTML file to write (default RUN_DIR/report.html; required for several runs)");
  return [o]() {
    if (o->run_dirs.size() > 1) {
      if (o->out.empty()) throw Error("loom report: comparing several runs needs --out FILE.html");
      std::vector<std::string> names;
      std::vector<std::vector<report::Row>> runs;
      for (const auto& run : o->run_dirs) {
        const std::string metrics = (fs::path(run) / "metrics.jsonl").string();
        std::error_code ec;
        if (!fs::exists(metrics, ec))
          throw Error(fmt::format("{}: does not exist", metrics),
                      "each argument must be the --run-dir of a loom train run");
        check_output("--out", o->out, {{"run_dir", metrics}});
        runs.push_back(read_rows(metrics));
        if (runs.back().empty()) throw Error(fmt::format("{}: no complete step logged", metrics));
        names.push_back(run_label(run));
      }
      write_file_atomic(o->out, report::render_compare(names, runs));
      fmt::print("{}\n", o->out);
      return 0;
    }
    const std::string& run = o->run_dirs[0];
    std::error_code ec;
    if (!fs::exists(run, ec))
      throw Error(fmt::format("run dir {}: does not exist", run),
                  "pass the --run-dir of a loom train run (default runs/<config name>)");
    if (!fs::is_directory(run, ec))
      throw Error(fmt::format("run dir {}: not a directory", run),
                  "pass the --run-dir of a loom train run (default runs/<config name>)");
    const std::string metrics = (fs::path(run) / "metrics.jsonl").string();
    if (!fs::exists(metrics, ec))
      throw Error(fmt::format("{}: does not exist", metrics),
                  "loom train writes it from its first step; is this a run directory?");
    std::vector<report::Row> rows = read_rows(metrics);
    if (rows.empty())
      throw Error(fmt::format("{}: no complete step logged", metrics),
                  "the run has not finished a step yet; run loom report once it has");
    const std::string config_path = (fs::path(run) / "config.toml").string();
    std::string config;
    const bool has_config = fs::exists(config_path, ec);
    if (has_config) config = read_file(config_path);
    const std::string out = o->out.empty() ? (fs::path(run) / "report.html").string() : o->out;
    check_output("--out", out, {{"run_dir", metrics}, {"run_dir", config_path}});
    write_file_atomic(out, report::render(run, rows, has_config ? &config : nullptr));
    fmt::print("{}\n", out);
    return 0;
  };
}

}  // namespace loom::cli
