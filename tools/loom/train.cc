// loom train: parses flags, starts the ranks and prints; the training loop itself is
// train::train_rank (src/loom/train/loop.h), which also documents the run directory it writes.
//
// With [outer] server set the run is an island of DiLoCo / asynchronous Local-SGD: IslandSync joins
// the outer service (outer/island.h) for the loop.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loom/core/file.h"
#include "loom/outer/island.h"
#include "loom/runtime/trace.h"
#include "loom/train/loop.h"
#include "ranks.h"

namespace loom::cli {

namespace {

std::string fmt_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = int64_t(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  return fmt::format("{}m{:02d}s", t / 60, t % 60);
}

// The training loop's view of an island.
class IslandSync : public train::OuterSync {
 public:
  IslandSync(const train::Config& cfg, train::ParamStore& params, const std::string& run_dir) {
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    // its key: this host and run directory, so a restarted island (loom train --resume on the same
    // run dir) is the same island to the server, with its id and data stream
    std::error_code ec;
    const std::string dir = std::filesystem::absolute(run_dir, ec).lexically_normal().string();
    island_ = std::make_unique<outer::Island>(cfg, params,
                                              fmt::format("{}:{} {}", host, ::getpid(), run_dir),
                                              fmt::format("{}:{}", host, ec ? run_dir : dir));
  }
  uint64_t id() const override { return island_->id(); }
  int64_t inner_steps() const override { return island_->inner_steps(); }
  bool sync(int64_t steps, double seconds, bool last) override {
    return island_->sync(steps, seconds, last);
  }
  nlohmann::json metrics() const override {
    nlohmann::json m = {{"outer_round", island_->rounds()},
                        {"outer_version", island_->version()},
                        {"bytes_sent", island_->bytes_sent()},
                        {"bytes_received", island_->bytes_received()},
                        {"peak_round_bytes", island_->peak_round_bytes()},
                        {"wait_s", island_->wait_s()},
                        {"wait_share", island_->round_wait_share()},
                        {"wait_share_total", island_->wait_share()}};
    if (island_->async()) {
      m["ahead_steps"] = island_->ahead_steps();
      m["yield_steps"] = island_->yield_steps();
    }
    return m;
  }
  train::ScheduleClock clock() const override { return island_->clock(); }
  void on_params(std::function<void(bool writes)> hook) override {
    island_->on_params(std::move(hook));
  }
  void compute(bool begins) override { island_->compute(begins); }
  std::string summary() const override {
    return fmt::format(
        "island {}: {} outer rounds, {} bytes sent, {} received (at most {} in a round), {:.1f} "
        "s waiting for the server ({:.1f}% of its wall time)",
        island_->id(), island_->rounds(), island_->bytes_sent(), island_->bytes_received(),
        island_->peak_round_bytes(), island_->wait_s(), 100 * island_->wait_share());
  }

 private:
  std::unique_ptr<outer::Island> island_;
};

}  // namespace

std::function<int()> add_train(CLI::App& app) {
  struct Opts {
    std::string config, run_dir, resume;
    std::vector<std::string> sets;
    double slowdown = 1;
    std::string stall;
    std::string trace;
    int64_t trace_steps = 3;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "train", "train a model on text (byte-level tokens) or on loom data prepare's token shards");
  s->add_option("config", o->config, "config TOML")->required();
  s->add_option("--run-dir", o->run_dir,
                "where metrics and checkpoints go (default runs/<config>)");
  s->add_option("--resume", o->resume, "auto: continue from the newest complete checkpoint")
      ->check(CLI::IsMember({"auto"}));
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  s->add_option("--slowdown", o->slowdown,
                "make each step take this many times as long, by sleeping (to test stragglers)")
      ->check(finite_number(1, 1000));
  s->add_option("--stall", o->stall,
                "STEP:SECONDS: sleep that long once before that step (to test a stalled island)");
  s->add_option("--trace", o->trace,
                "write the first --trace-steps steps as a Chrome trace (per rank: compute and comm "
                "lanes)");
  s->add_option("--trace-steps", o->trace_steps, "steps --trace records (default 3)")
      ->check(whole_number(1, 1 << 20));
  return [o]() {
    train::Config cfg = train::load_config(o->config, o->sets);
    if (!o->trace.empty())
      check_output("--trace", o->trace);  // before training: not lost at its end
    train::RunOptions opts{
        .run_dir = o->run_dir,
        .resume = !o->resume.empty(),
        .slowdown = o->slowdown,
        .stall = o->stall.empty() ? train::Stall{} : train::parse_stall(o->stall),
        .trace_path = o->trace,
        .trace_steps = o->trace_steps};
    opts.join_outer = [&cfg](train::ParamStore& params, const std::string& run_dir) {
      return std::unique_ptr<train::OuterSync>(std::make_unique<IslandSync>(cfg, params, run_dir));
    };
    train::Run run = train::open_run(cfg, opts);
    const bool tty = ::isatty(STDOUT_FILENO);
    auto progress = [&](const train::StepReport& s) {
      if (!tty) return;
      double eta = s.elapsed_s / double(s.step - s.start + 1) * double(s.max_steps - s.step);
      fmt::print("\rstep {}/{}  loss {:.4f}  {:.0f} tok/s  ETA {}   ", s.step, s.max_steps, s.loss,
                 s.tokens_per_s, fmt_eta(eta));
      std::fflush(stdout);
    };
    const shard::Plan& plan = cfg.plan.plan;
    return run_ranks(cfg, [&](const runtime::MeshComms* comms) -> int {
      const train::RunResult r = train::train_rank(cfg, run, opts, comms, progress);
      if (comms && comms->world().rank() != 0) return 0;
      if (tty) fmt::print("\n");
      if (r.already_trained) {
        fmt::print("{} is already trained to step {}\n", run.dir, cfg.train.steps);
        return 0;
      }
      fmt::print("trained to step {}: train loss {:.4f}, val loss {:.4f}", r.last_step, r.loss,
                 r.last_val);
      if (!std::isnan(r.first_val)) fmt::print(" (at step 1: {:.4f})", r.first_val);
      if (comms) fmt::print(" on {} ranks {}", plan.mesh.size(), plan.mesh.to_string());
      fmt::print("; run dir {}\n", run.dir);
      if (!r.outer_summary.empty()) fmt::print("{}\n", r.outer_summary);
      return 0;
    });
  };
}

}  // namespace loom::cli
