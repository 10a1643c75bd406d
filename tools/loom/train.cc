// loom train: the training loop. Byte-level text or token shards (loom data prepare), AdamW with
// warmup + cosine, evaluation, metrics.jsonl, atomic checkpoints and exact resume (--resume auto).
//
// The run directory holds config.toml (the resolved config), metrics.jsonl (one JSON object per step:
// step, loss, lr, grad_norm, tokens_per_s, elapsed_s since this process started training, and
// val_loss when evaluated) and checkpoints/.
//
// With [outer] server set the run is an island of DiLoCo / asynchronous Local-SGD (outer/island.h):
// it starts from the server's parameters, samples its own data stream (rank = its island id - 1), and
// every H steps pushes its pseudo-gradient and pulls the new global parameters. Those steps' metrics
// add outer_round, outer_version, bytes_sent, bytes_received and wait_s (cumulative); an evaluation
// on such a step measures the global parameters just pulled.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "ranks.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/data/text_corpus.h"
#include "loom/outer/island.h"
#include "loom/train/checkpoint.h"
#include "loom/train/evaluate.h"
#include "loom/train/schedule.h"
#include "loom/train/step.h"

namespace loom::cli {

namespace fs = std::filesystem;

namespace {

std::string fmt_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = int64_t(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  return fmt::format("{}m{:02d}s", t / 60, t % 60);
}

// Keeps the metrics lines of steps <= `upto` (a resumed run rewrites what came after its checkpoint).
void truncate_metrics(const std::string& path, int64_t upto) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.value("step", int64_t(0)) <= upto) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      break;  // a torn last line from a crash
    }
  }
  in.close();
  write_file_atomic(path, kept);
}

}  // namespace

std::function<int()> add_train(CLI::App& app) {
  struct Opts {
    std::string config, run_dir, resume;
    std::vector<std::string> sets;
    double slowdown = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "train", "train a model on text (byte-level tokens) or on loom data prepare's token shards");
  s->add_option("config", o->config, "config TOML")->required();
  s->add_option("--run-dir", o->run_dir, "where metrics and checkpoints go (default runs/<config>)");
  s->add_option("--resume", o->resume, "auto: continue from the newest complete checkpoint")
      ->check(CLI::IsMember({"auto"}));
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  s->add_option("--slowdown", o->slowdown,
                "make each step take this many times as long, by sleeping (to test stragglers)")
      ->check(CLI::Range(1.0, 1000.0));
  return [o]() {
    train::Config cfg = train::load_config(o->config, o->sets);
    if (cfg.data.path.empty())
      throw Error(fmt::format("{}: [data] path is not set", o->config),
                  "point it at a text file, a directory of .txt files, or a loom data prepare "
                  "directory");
    const int64_t T = cfg.train.seq_len;
    data::TextCorpus corpus = data::TextCorpus::open(cfg.data.path, T);
    if (corpus.prepared() && corpus.vocab_size() != cfg.model.vocab_size)
      throw Error(fmt::format("{}: the tokenizer's vocabulary does not match the model: vocab_size "
                              "{} there, [model] vocab_size = {} in {}",
                              corpus.meta_path(), corpus.vocab_size(), cfg.model.vocab_size,
                              o->config),
                  fmt::format("set [model] vocab_size = {}, or prepare the data again with "
                              "--vocab-size {}",
                              corpus.vocab_size(), cfg.model.vocab_size));
    if (!corpus.prepared() && cfg.model.vocab_size < 256)
      throw Error(fmt::format("{}: [model] vocab_size = {} is too small for byte-level tokens",
                              o->config, cfg.model.vocab_size),
                  "byte-level text needs vocab_size >= 256");
    std::string run = o->run_dir.empty() ? "runs/" + fs::path(o->config).stem().string() : o->run_dir;
    const std::string ckdir = run + "/checkpoints", metrics = run + "/metrics.jsonl";
    std::error_code ec;
    fs::create_directories(run, ec);
    if (ec) throw Error(fmt::format("run dir {}: cannot create ({})", run, ec.message()));
    auto latest = train::latest_checkpoint(ckdir);
    if (latest && o->resume.empty())
      throw Error(fmt::format("run dir {} already holds checkpoints", run),
                  "pass --resume auto to continue it, or choose another --run-dir");

    const shard::Plan& plan = cfg.plan.plan;
    if (!plan.empty() && o->slowdown > 1)
      throw Error(fmt::format("{}: --slowdown makes a straggler island; the ranks of a [plan] step "
                              "together", o->config),
                  "drop --slowdown, or run without [plan]");
    if (!plan.empty() && !cfg.outer.server.empty())
      throw Error(fmt::format("{}: [outer] islands with a [plan] are not supported yet", o->config),
                  "run each island as one process (no [plan]), or drop [outer]");

    // One rank's training loop; `comms` is null without a plan. Rank 0 writes metrics and
    // checkpoints; every rank computes (a sharded step, gathers and evaluation are collective).
    auto train_rank = [&](const runtime::MeshComms* comms) -> int {
      const bool writer = !comms || comms->world().rank() == 0;
      train::ParamStore params(cfg.model);
      params.init_random(uint64_t(cfg.train.seed));
      train::StepRunner runner(cfg, params, train::StepRunner::Mode::train, comms);
      // the evaluator reads the trainer's parameter blocks (a sharded run keeps no second copy)
      train::StepRunner evaluator(cfg, params, train::StepRunner::Mode::eval, comms, &runner);
      int64_t start = 1;
      if (latest) {
        train::load_checkpoint(*latest, params, runner);
        start = runner.step_count() + 1;
        if (writer) {
          fmt::print(stderr, "resuming from {} (step {})\n", *latest, runner.step_count());
          truncate_metrics(metrics, runner.step_count());
        }
      } else {
        // [model] init: a fresh run starts from given weights (loom export's output, a checkpoint's
        // model.safetensors) instead of the random init; a resumed run takes its checkpoint's instead.
        if (!cfg.init_weights.empty()) {
          auto w = train::model_file(cfg.init_weights);
          if (!w)
            throw Error(fmt::format("{}: [model] init: no such file {}", o->config, cfg.init_weights),
                        "point it at a model.safetensors or a directory holding one (loom export)");
          params.load(*w);  // names, dtypes and shapes checked against [model]
          runner.pull_params();
          if (writer) fmt::print(stderr, "initialised from {}\n", *w);
        }
        if (writer) std::ofstream(metrics, std::ios::trunc);
      }
      // a sharded run's parameters now live in the runner's blocks: free the whole copies
      runner.release_params();
      // an island takes the server's parameters (whatever a checkpoint or [model] init held)
      std::unique_ptr<outer::Island> island;
      if (!cfg.outer.server.empty()) {
        char host[256] = "?";
        ::gethostname(host, sizeof host - 1);
        island = std::make_unique<outer::Island>(cfg, params,
                                                 fmt::format("{}:{} {}", host, ::getpid(), run));
      }
      const int rank = island ? int(island->id()) - 1 : 0;  // island ids count from 1
      if (writer) write_file_atomic(run + "/config.toml", cfg.text);
      // the run keeps its tokenizer, so loom sample decodes the same ids wherever the data moves
      std::error_code ec;
      if (writer && corpus.prepared() && fs::exists(cfg.data.path + "/tokenizer.model", ec)) {
        fs::copy_file(cfg.data.path + "/tokenizer.model", run + "/tokenizer.model",
                      fs::copy_options::overwrite_existing, ec);
        if (ec)
          throw Error(fmt::format("cannot copy {}/tokenizer.model to {}: {}", cfg.data.path, run,
                                  ec.message()));
      }
      train::Schedule sched{.lr = cfg.optim.lr, .min_lr = cfg.train.min_lr,
                            .warmup = cfg.train.warmup_steps, .total = cfg.train.steps};
      std::ofstream log;
      if (writer) {
        log.open(metrics, std::ios::app);
        if (!log) throw Error(fmt::format("cannot write {}", metrics));
      }
      const bool tty = writer && ::isatty(STDOUT_FILENO);
      const int64_t rows = runner.rows_per_step();  // batch_size * grad_accum
      std::vector<int32_t> tokens(size_t(rows * (T + 1)));
      auto evaluate = [&]() { return train::validation_loss(cfg, corpus, evaluator); };
      auto save = [&]() {
        train::save_checkpoint(ckdir, params, runner, {{"data", cfg.data.path}}, cfg.text,
                               int(cfg.checkpoint.keep), writer);
        runner.release_params();  // the gathered whole parameters were only for the file
      };
      double first_val = NAN, last_val = NAN;
      float loss = NAN;
      auto t_start = std::chrono::steady_clock::now();
      int64_t round_steps = 0;   // inner steps since the last outer sync
      double round_seconds = 0;  // and the time they took
      int64_t last_step = start - 1;
      // An async island whose server holds a step budget ([outer] islands x [train] steps) trains until
      // the server says it is spent: a fast island goes on past [train] steps (at the schedule's final
      // lr) while a slow one stops short of them; at most twice [train] steps.
      const bool until_done =
          island && cfg.outer.mode == train::OuterMode::async && cfg.outer.islands > 0;
      const int64_t max_steps = until_done ? 2 * cfg.train.steps : cfg.train.steps;
      for (int64_t step = start; step <= max_steps; ++step) {
        last_step = step;
        corpus.sample(data::TextCorpus::Split::train, uint64_t(cfg.train.seed), step, rank, rows, T,
                      tokens.data());
        double lr = sched.at(step);
        auto t0 = std::chrono::steady_clock::now();
        loss = runner.step(tokens.data(), lr);
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (o->slowdown > 1) {
          std::this_thread::sleep_for(std::chrono::duration<double>(dt * (o->slowdown - 1)));
          dt *= o->slowdown;
        }
        if (!std::isfinite(loss))
          throw Error(fmt::format("the loss is {} at step {}", loss, step),
                      "lower [optim] lr or raise [train] warmup_steps; resume from the last checkpoint");
        nlohmann::json m{{"step", step},
                         {"loss", loss},
                         {"lr", lr},
                         {"grad_norm", runner.grad_norm()},
                         {"tokens_per_s", double(rows * T) / dt}};
        bool last = step == max_steps;
        if (island) {
          ++round_steps;
          round_seconds += dt;
          if (round_steps >= island->inner_steps() || last) {
            if (!island->sync(round_steps, round_seconds)) last = true;  // the step budget is spent
            round_steps = 0;
            round_seconds = 0;
            m["outer_round"] = island->rounds();
            m["outer_version"] = island->version();
            m["bytes_sent"] = island->bytes_sent();
            m["bytes_received"] = island->bytes_received();
            m["wait_s"] = island->wait_s();
          }
        }
        // evaluation steps depend only on the step number, so a resumed run logs what a straight one does
        if ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || last || step == 1) {
          double v = evaluate();
          m["val_loss"] = v;
          if (step == 1) first_val = v;
          last_val = v;
        }
        m["elapsed_s"] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (writer) {
          log << m.dump() << "\n";
          log.flush();
        }
        if ((cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || last) save();
        if (tty) {
          double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
          double eta = el / double(step - start + 1) * double(max_steps - step);
          fmt::print("\rstep {}/{}  loss {:.4f}  {:.0f} tok/s  ETA {}   ", step, max_steps,
                     loss, double(rows * T) / dt, fmt_eta(eta));
          std::fflush(stdout);
        }
        if (last) break;
      }
      if (tty) fmt::print("\n");
      if (!writer) return 0;
      if (start > cfg.train.steps) {
        fmt::print("{} is already trained to step {}\n", run, cfg.train.steps);
        return 0;
      }
      fmt::print("trained to step {}: train loss {:.4f}, val loss {:.4f}", last_step, loss, last_val);
      if (!std::isnan(first_val)) fmt::print(" (at step 1: {:.4f})", first_val);
      if (comms) fmt::print(" on {} ranks {}", plan.mesh.size(), plan.mesh.to_string());
      fmt::print("; run dir {}\n", run);
      if (island)
        fmt::print("island {}: {} outer rounds, {} bytes sent, {} received, {:.1f} s waiting for the "
                   "server\n", island->id(), island->rounds(), island->bytes_sent(),
                   island->bytes_received(), island->wait_s());
      return 0;
    };
    return run_ranks(cfg, train_rank);
  };
}

}  // namespace loom::cli
