#include "loom/train/loop.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/runtime/trace.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_writer.h"
#include "loom/train/evaluate.h"
#include "loom/train/hf_dir.h"
#include "loom/train/plan_island.h"
#include "loom/train/schedule.h"
#include "loom/train/step.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// An MoE model's step metrics: the cross-entropy alone (`loss` holds the objective with the
// auxiliary losses) and the router's load over every MoE layer: the most and the mean tokens an
// expert kept, and the choices dropped at capacity.
void add_router_metrics(const StepRunner& runner, nlohmann::json& m) {
  const auto& load = runner.router_load();
  if (load.kept.empty()) return;
  m["ce_loss"] = runner.ce_loss();
  double max = 0, kept = 0, routed = 0;
  for (float k : load.kept) max = std::max(max, double(k)), kept += k;
  for (float r : load.routed) routed += r;
  m["moe_tokens_max"] = max;
  m["moe_tokens_mean"] = kept / double(load.kept.size());
  m["moe_dropped"] = routed - kept;
}

// Drops the metrics of steps after `upto` (a resumed run logs them again). Nothing it cannot parse
// is dropped, except a torn last line (a crash mid-write: no newline at its end); an unparsable
// line is kept where it is, and said so.
void truncate_metrics(const std::string& path, int64_t upto) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const std::string text = read_file(path);  // a regular file only (a FIFO would block)
  std::istringstream in(text);
  std::string line, kept;
  int64_t n = 0;
  std::vector<int64_t> unparsed;
  while (std::getline(in, line)) {
    ++n;
    const bool last_torn = in.eof() && !text.empty() && text.back() != '\n';
    try {
      auto j = nlohmann::json::parse(line);
      const auto step = j.is_object() ? j.find("step") : j.end();
      if (step == j.end() || !step->is_number_integer()) throw std::invalid_argument("no step");
      if (step->get<int64_t>() <= upto) kept += line + "\n";
    } catch (const std::exception&) {
      if (last_torn) break;
      unparsed.push_back(n);
      kept += line + "\n";
    }
  }
  if (!unparsed.empty())
    fmt::print(stderr, "{}: kept {} line{} that {} not metrics (line {}{})\n", path,
               unparsed.size(), unparsed.size() > 1 ? "s" : "", unparsed.size() > 1 ? "are" : "is",
               unparsed.front(), unparsed.size() > 1 ? ", ..." : "");
  write_file_atomic(path, kept);
}

// A pretrained model ([model] init, a Hugging Face directory with its tokenizer.json) trains only
// on text its own tokenizer made: raw text (byte ids) or data prepared with another tokenizer
// would feed it ids that mean other pieces, with no error anywhere.
void check_data_tokenizer(const Config& cfg, const data::TextCorpus& corpus) {
  if (!is_hf_dir(cfg.init_weights)) return;
  const std::string model_tok = cfg.init_weights + "/tokenizer.json";
  if (!path_exists(model_tok)) return;
  const std::string data_tok = cfg.data.path + "/tokenizer.json";
  if (corpus.prepared() && path_exists(data_tok) && read_file(data_tok) == read_file(model_tok))
    return;
  throw Error(
      fmt::format("{}: [data] path {} is {}, but [model] init {} is a pretrained model with its "
                  "own tokenizer ({})",
                  cfg.path, cfg.data.path,
                  corpus.prepared() ? "prepared with another tokenizer"
                                    : "text, which would be read as byte ids",
                  cfg.init_weights, model_tok),
      fmt::format("prepare the text with the model's tokenizer: loom data prepare --input TEXT "
                  "--out DIR --tokenizer {}, then set [data] path = \"DIR\"",
                  cfg.init_weights));
}

}  // namespace

int64_t clocked_step(const ScheduleClock& c, int64_t step, int64_t since) {
  if (!c.on) return step;
  return std::max<int64_t>(1, std::llround(c.at + c.rate * double(c.now + since + 1 - c.t)));
}

Stall parse_stall(const std::string& spec) {
  const size_t colon = spec.find(':');
  Stall s;
  try {
    size_t a = 0, b = 0;
    if (colon != std::string::npos) {
      s.step = std::stoll(spec.substr(0, colon), &a);
      s.seconds = std::stod(spec.substr(colon + 1), &b);
    }
    if (colon == std::string::npos || a != colon || b != spec.size() - colon - 1) s.step = 0;
  } catch (const std::exception&) {
    s.step = 0;
  }
  if (s.step < 1 || !(s.seconds > 0 && s.seconds <= 86400))
    throw Error(
        fmt::format("--stall {}: expected STEP:SECONDS with STEP >= 1 and 0 < SECONDS <= "
                    "86400",
                    spec));
  return s;
}

Run open_run(const Config& cfg, const RunOptions& opts) {
  if (cfg.data.path.empty())
    throw Error(fmt::format("{}: [data] path is not set", cfg.path),
                "point it at a text file, a directory of .txt files, or a loom data prepare "
                "directory");
  data::TextCorpus corpus = data::TextCorpus::open(cfg.data.path, cfg.train.seq_len);
  check_data_tokenizer(cfg, corpus);
  if (corpus.prepared() && corpus.vocab_size() != cfg.model.vocab_size)
    throw Error(
        fmt::format("{}: the tokenizer's vocabulary does not match the model: vocab_size "
                    "{} there, [model] vocab_size = {} in {}",
                    corpus.meta_path(), corpus.vocab_size(), cfg.model.vocab_size, cfg.path),
        fmt::format("set [model] vocab_size = {}, or prepare the data again with "
                    "--vocab-size {}",
                    corpus.vocab_size(), cfg.model.vocab_size));
  if (!corpus.prepared() && cfg.model.vocab_size < 256)
    throw Error(fmt::format("{}: [model] vocab_size = {} is too small for byte-level tokens",
                            cfg.path, cfg.model.vocab_size),
                "byte-level text needs vocab_size >= 256");
  const std::string dir =
      opts.run_dir.empty() ? "runs/" + fs::path(cfg.path).stem().string() : opts.run_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("run dir {}: cannot create ({})", dir, ec.message()));
  Run run{dir, dir + "/checkpoints", dir + "/metrics.jsonl", {}, std::move(corpus), nullptr};
  // one training run per run directory, locked before any look inside it: a second `loom train`
  // stops here. The ranks of an mpirun job are processes of their own: rank 0 locks (train_rank).
  if (cfg.plan.plan.empty() || cfg.plan.ranks != "mpi")
    run.lock = std::make_shared<DirLock>(DirLock::acquire(dir, "run dir"));
  run.latest = latest_checkpoint(run.checkpoints);
  if (run.latest && !opts.resume)
    throw Error(fmt::format("run dir {} already holds checkpoints", dir),
                "pass --resume auto to continue it, or choose another --run-dir");
  // an earlier run's log that no checkpoint continues: a fresh run would truncate it
  std::error_code mec;
  if (!run.latest && fs::is_regular_file(run.metrics, mec) && fs::file_size(run.metrics, mec) > 0 &&
      !mec)
    throw Error(fmt::format("run dir {} holds an earlier run's metrics.jsonl but no checkpoint to "
                            "resume from",
                            dir),
                "choose another --run-dir, or move its metrics.jsonl away to start afresh there");
  const shard::Plan& plan = cfg.plan.plan;
  if (!plan.empty() && opts.slowdown > 1)
    throw Error(fmt::format("{}: --slowdown makes a straggler island; the ranks of a [plan] step "
                            "together",
                            cfg.path),
                "drop --slowdown, or run without [plan]");
  return run;
}

RunResult train_rank(const Config& cfg, Run& run, const RunOptions& opts,
                     const runtime::MeshComms* comms,
                     const std::function<void(const StepReport&)>& progress) {
  const bool writer = !comms || comms->world().rank() == 0;
  const int64_t T = cfg.train.seq_len;
  ParamStore params(cfg.model);
  params.init_random(uint64_t(cfg.train.seed));
  StepRunner runner(cfg, params, StepRunner::Mode::train, comms);
  // the evaluator reads the trainer's parameter blocks (a sharded run keeps no second copy)
  StepRunner evaluator(cfg, params, StepRunner::Mode::eval, comms, &runner);
  RunResult r;
  // the run directory's lock: open_run took it, except in an mpirun job, whose rank 0 takes it
  // here before it reads or writes anything there
  std::optional<DirLock> lock;
  if (writer && !run.lock) lock.emplace(DirLock::acquire(run.dir, "run dir"));  // mpirun's rank 0
  if (run.latest) {
    // the newest checkpoint that loads whole: a damaged one (a checksum, a torn file) is passed
    // over, saying so, and left where it is
    const std::vector<std::string> all = list_checkpoints(run.checkpoints);
    std::string failures;
    bool loaded = false;
    for (auto it = all.rbegin(); it != all.rend() && !loaded; ++it) {
      try {
        load_checkpoint(*it, params, runner);
        run.latest = *it;
        loaded = true;
      } catch (const Error& e) {
        if (writer)
          fmt::print(stderr, "cannot resume from {}: {}\n{}", *it, e.what(),
                     std::next(it) != all.rend() ? "trying the checkpoint before it\n" : "");
        failures += fmt::format("\n  {}: {}", *it, e.what());
      }
    }
    if (!loaded)
      throw Error(
          fmt::format("run dir {}: no checkpoint can be resumed from:{}", run.dir, failures),
          "restore a checkpoint, or start a new run in another --run-dir");
    r.start = runner.step_count() + 1;
    if (writer) {
      fmt::print(stderr, "resuming from {} (step {})\n", *run.latest, runner.step_count());
      truncate_metrics(run.metrics, runner.step_count());
    }
  } else {
    // [model] init: a fresh run starts from given weights (loom export's output, a checkpoint's
    // model.safetensors) instead of the random init; a resumed run takes its checkpoint's instead.
    if (!cfg.init_weights.empty()) {
      params.load_init(cfg);  // names, dtypes and shapes checked against [model]
      runner.pull_params();
      if (writer) fmt::print(stderr, "initialised from {}\n", cfg.init_weights);
    }
    if (writer) write_file_atomic(run.metrics, "");
  }
  // an island takes the server's parameters (whatever a checkpoint or [model] init held); with a
  // [plan], rank 0 is the island and every rank follows it (plan_island.h)
  std::unique_ptr<OuterSync> island;
  if (!cfg.outer.server.empty()) {
    LOOM_CHECK(opts.join_outer) << "[outer] server set but no way to join it";
    if (comms)
      island = std::make_unique<PlanIsland>(writer ? opts.join_outer(params, run.dir) : nullptr,
                                            params, runner, comms->world());
    else {
      island = opts.join_outer(params, run.dir);
      runner.pull_params();  // on a GPU: the server's parameters up to the runner's copies
    }
  }
  // a one-process island reads and changes the store: on a GPU the parameters come down before
  // its first read and go back up after it changed them (PlanIsland moves a plan's ranks' itself)
  bool island_pushed = false, island_wrote = false;
  if (island && !comms)
    island->on_params([&](bool writes) {
      if (!island_pushed) runner.push_params();
      island_pushed = true;
      island_wrote |= writes;
    });
  // a sharded run's parameters now live in the runner's blocks: free the whole copies
  runner.release_params();
  const int rank = island ? int(island->id()) - 1 : 0;  // island ids count from 1
  if (writer) write_file_atomic(run.dir + "/config.toml", cfg.text);
  // the run keeps its tokenizer, so loom sample decodes the same ids wherever the data moves
  std::error_code ec;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const std::string from = cfg.data.path + "/" + name;
    if (!writer || !run.corpus.prepared() || !fs::exists(from, ec)) continue;
    fs::copy_file(from, run.dir + "/" + name, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error(fmt::format("cannot copy {} to {}: {}", from, run.dir, ec.message()));
  }
  // a pretrained model's files that are not weights (hf_dir.h: kHfSourceFiles) go with the run to
  // RUN/hf/: loom sample reads its stop tokens and chat template there, loom export --hf writes
  // them out again
  if (writer && is_hf_dir(cfg.init_weights))
    copy_hf_source_files(cfg.init_weights, run.dir + "/hf");
  Schedule sched{.lr = cfg.optim.lr,
                 .min_lr = cfg.train.min_lr,
                 .warmup = cfg.train.warmup_steps,
                 .total = cfg.train.steps};
  std::optional<AppendFile> log;  // every line's write checked: a full disk stops the run
  if (writer) log.emplace(run.metrics);
  const int64_t rows = runner.rows_per_step();  // batch_size * grad_accum
  std::vector<int32_t> tokens(size_t(rows * (T + 1)));
  CheckpointWriter checkpoints(run.checkpoints, cfg.checkpoint.keep, cfg.checkpoint.async, writer);
  auto save = [&]() {
    if (log) log->sync();  // the metrics up to a checkpoint are as durable as it
    checkpoints.save(params, runner, {{"data", cfg.data.path}}, cfg.text);
    runner.release_params();  // a whole checkpoint's gathered parameters were only for the file
  };
  // a checkpoint's figures go into the first metrics line after it is committed
  int64_t logged_checkpoint = -1;
  auto checkpoint_metrics = [&](nlohmann::json& m) {
    const CheckpointWriter::Stats& c = checkpoints.last();
    if (c.step <= logged_checkpoint) return;
    logged_checkpoint = c.step;
    m["checkpoint_step"] = c.step;
    m["checkpoint_blocked_s"] = c.blocked_s;  // the loop's time in it
    m["checkpoint_write_s"] = c.write_s;
    m["checkpoint_mb"] = double(c.bytes) / 1e6;  // this rank's files
  };
  r.first_val = r.last_val = NAN;
  r.loss = NAN;
  r.last_step = r.start - 1;
  const auto t_start = std::chrono::steady_clock::now();
  runtime::Trace trace;
  int64_t round_steps = 0;   // inner steps since the last outer sync
  double round_seconds = 0;  // and the time they took
  // An async island whose server holds a step budget ([outer] islands x [train] steps) trains until
  // the server says it is spent: a fast island goes on past [train] steps (at the schedule's final
  // lr) while a slow one stops short of them; at most twice [train] steps.
  const bool until_done =
      island && cfg.outer.mode == outer::OuterMode::async && cfg.outer.islands > 0;
  const int64_t max_steps = until_done ? 2 * cfg.train.steps : cfg.train.steps;
  for (int64_t step = r.start; step <= max_steps; ++step) {
    r.last_step = step;
    run.corpus.sample(data::TextCorpus::Split::train, uint64_t(cfg.train.seed), step, rank, rows, T,
                      tokens.data());
    // an async island with a step budget follows the schedule's shared clock (outer/island.h)
    const double lr = sched.at(island ? clocked_step(island->clock(), step, round_steps) : step);
    if (!opts.trace_path.empty())
      runner.set_trace(step - r.start < opts.trace_steps ? &trace : nullptr);
    if (step == opts.stall.step)
      std::this_thread::sleep_for(std::chrono::duration<double>(opts.stall.seconds));
    if (island) island->compute(true);
    const auto t0 = std::chrono::steady_clock::now();
    r.loss = runner.step(tokens.data(), lr);
    double dt = seconds_since(t0);
    if (island) island->compute(false);
    if (opts.slowdown > 1) {
      std::this_thread::sleep_for(std::chrono::duration<double>(dt * (opts.slowdown - 1)));
      dt *= opts.slowdown;
    }
    if (!std::isfinite(r.loss))
      throw Error(
          fmt::format("the loss is {} at step {}", r.loss, step),
          "lower [optim] lr or raise [train] warmup_steps; resume from the last checkpoint");
    nlohmann::json m{{"step", step},
                     {"loss", r.loss},
                     {"lr", lr},
                     {"grad_norm", runner.grad_norm()},
                     {"tokens_per_s", double(rows * T) / dt}};
    add_router_metrics(runner, m);
    bool last = step == max_steps;
    if (island) {
      ++round_steps;
      round_seconds += dt;
      if (round_steps >= island->inner_steps() || last) {
        island_pushed = island_wrote = false;
        if (!island->sync(round_steps, round_seconds, last)) last = true;  // the budget is spent
        if (island_wrote) runner.pull_params();
        round_steps = 0;
        round_seconds = 0;
        m.update(island->metrics());
      }
    }
    // evaluation steps depend only on the step number, so a resumed run logs what a straight one
    // does
    if ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || last || step == 1) {
      const double v = validation_loss(cfg, run.corpus, evaluator);
      m["val_loss"] = v;
      if (step == 1) r.first_val = v;
      r.last_val = v;
    }
    m["elapsed_s"] = seconds_since(t_start);
    checkpoints.poll();  // an asynchronous checkpoint written by now goes into place
    checkpoint_metrics(m);
    if (writer) {
      log->append(m.dump());
    }
    if ((cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || last) save();
    if (writer && progress)
      progress({.step = step,
                .max_steps = max_steps,
                .start = r.start,
                .loss = r.loss,
                .tokens_per_s = double(rows * T) / dt,
                .elapsed_s = seconds_since(t_start)});
    if (last) break;
  }
  checkpoints.finish();
  if (!opts.trace_path.empty()) {
    runner.set_trace(nullptr);
    runtime::write_trace(opts.trace_path, trace, comms);
  }
  r.already_trained = r.start > cfg.train.steps;
  if (island) r.outer_summary = island->summary();
  if (log) log->sync();
  return r;
}

}  // namespace loom::train
