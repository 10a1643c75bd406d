// loom bench: trains on synthetic tokens and prints one JSON line of throughput and memory.
//
// With a [plan] every rank runs the step (ranks.h: threads or mpirun processes) on the same global
// batch; rank 0 prints the line, with the plan and, per rank, the planned bytes of parameters,
// gradients and optimizer moments, the planned peak and the measured peak RSS. Memory beside a
// peer: baseline_rss_bytes (rank 0's process with its libraries loaded, before the model is built)
// and peak_above_baseline_bytes (its peak above that: the model, optimizer state and steps), so
// that what a runtime holds resident before any model (libraries, a framework's allocator) and
// what training needs can be told apart.
//
// Communication, over the timed steps: collectives_per_step, and exposed_comm_ms, the time per step
// the compute thread spent blocked on collectives (runtime::Executor::CommStats; the ranks' mean,
// each rank's in per_rank), and its fraction of the median step. activation_bytes: the planned
// bytes of activations saved for the backward (runtime/memory_plan.h). --trace F.json writes the
// timed steps as a Chrome trace (runtime/trace.h).
//
// model_flops_per_token = 6 * (matmul params incl. the output head) + 12 * L * T * d_model
// (training forward+backward; models::train_flops_per_token), so achieved_gflops is comparable
// across implementations of the same model (it ignores the causal half-saving and recomputation).
//
// --kernels-out K.json writes every kernel of the step's program (sim/kernel_list.h) with the mean
// seconds of one call over the timed steps, each kernel stamped on the device's queue as the steps
// run (runtime::Executor's profile: a GPU's kernels back to back, not recorded as a graph): Loom's
// own kernels in the form `loom calibrate --import K.json --base CLUSTER --out C.toml` makes a
// cluster's profile of, so that `loom plan --cluster C.toml` predicts Loom's step on that device.
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/ops/linear.h"
#include "loom/runtime/trace.h"
#include "loom/sim/kernel_list.h"
#include "loom/train/step.h"
#include "ranks.h"

namespace loom::cli {

namespace {

struct BenchOpts {
  std::string config;
  int steps = 10, warmup = 3;
  bool profile = false;
  std::string trace, kernels_out;
  std::vector<std::string> sets;
};

// The timed steps of one rank: each step's milliseconds, the last loss, and the communication
// counters around them.
struct Timed {
  std::vector<double> ms;
  float loss = 0;
  runtime::Executor::CommStats comm0, comm1;
};

Timed time_steps(const BenchOpts& o, const train::Config& cfg, train::StepRunner& runner,
                 runtime::Trace& trace) {
  const int64_t T = cfg.train.seq_len;
  std::mt19937 rng(uint32_t(cfg.train.seed) + 1);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg.model.vocab_size - 1));
  const int64_t rows = runner.rows_per_step();  // batch_size * grad_accum
  std::vector<int32_t> tokens(size_t(rows * (T + 1)));
  Timed r;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    for (auto& t : tokens) t = tok(rng);
    if (i == o.warmup) {  // the timed steps
      runner.executor().set_profiling(o.profile || !o.kernels_out.empty());
      if (!o.trace.empty()) runner.set_trace(&trace);
      r.comm0 = runner.comm_stats();
    }
    auto t0 = std::chrono::steady_clock::now();
    r.loss = runner.step(tokens.data());
    auto t1 = std::chrono::steady_clock::now();
    if (i >= o.warmup) r.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  runner.set_trace(nullptr);
  if (!std::isfinite(r.loss)) throw Error("bench: the loss is not finite");
  r.comm1 = runner.comm_stats();
  return r;
}

// --profile: time per op, the memory plan's report, and the matmuls grouped by shape (stderr).
void print_profile(const BenchOpts& o, train::StepRunner& runner) {
  const int steps = o.steps;
  nlohmann::json p = nlohmann::json::object();
  for (auto& [op, t] : runner.executor().op_times())
    p[op] = {{"ms_per_step", t.seconds * 1000.0 / steps}, {"calls", t.calls}};
  fmt::print(stderr, "{}\n", p.dump());
  fmt::print(stderr, "{}", runtime::memory_report(runner.program(), runner.executor().plan()));
  // matmuls grouped by shape: where the GEMM time goes
  struct Group {
    double seconds = 0, flops = 0;
    int calls = 0;
  };
  std::map<std::string, Group> mm;
  const auto& nt = runner.executor().node_times();
  const ir::Graph& g = runner.program();
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::matmul) continue;
    ops::MatmulDims d = ops::matmul_dims(g, n);
    std::string key = fmt::format("M={} N={} K={} ta={} tb={} {}->{}", d.M, d.N, d.K, int(d.ta),
                                  int(d.tb), dtype_name(g.value(n.inputs[0]).type.dtype),
                                  dtype_name(g.value(n.outputs[0]).type.dtype));
    Group& gr = mm[key];
    gr.seconds += nt[n.id].seconds / steps;
    gr.flops += 2.0 * double(d.batch * d.M) * double(d.N) * double(d.K);
    gr.calls++;
  }
  for (const auto& [k, gr] : mm)
    fmt::print(stderr, "  matmul {:<44} x{:<3} {:8.1f} ms/step {:6.1f} GFLOP/s\n", k, gr.calls,
               gr.seconds * 1000.0, gr.seconds > 0 ? gr.flops / gr.seconds / 1e9 : 0.0);
}

// --kernels-out: the step's kernels, each signature with the mean seconds of one call and its
// calls per step (under gradient accumulation a node of the micro-batch prefix runs grad_accum
// times a step, the optimizer's once).
void write_kernels(const BenchOpts& o, train::StepRunner& runner) {
  const ir::Graph& g = runner.program();
  const auto& nt = runner.executor().node_times();
  // the timed steps: the program's last node runs once a step
  const double steps = g.nodes().empty() ? 1.0 : double(std::max<int64_t>(1, nt.back().calls));
  struct Kernel {
    nlohmann::json entry;
    double seconds = 0;
    int64_t calls = 0;  // over the timed steps
    int64_t scratch = 0;
  };
  std::map<std::string, Kernel> by_sig;
  for (const ir::Node& n : g.nodes()) {
    if (!sim::listed_kernel(n) || nt[size_t(n.id)].calls == 0) continue;
    nlohmann::json k = sim::kernel_json(g, n);
    Kernel& e = by_sig[sim::kernel_signature(k)];
    if (e.calls == 0) e.entry = std::move(k);
    e.seconds += nt[size_t(n.id)].seconds;
    e.calls += nt[size_t(n.id)].calls;
    e.scratch = std::max(e.scratch, nt[size_t(n.id)].scratch_bytes);
  }
  nlohmann::json doc;
  doc["device"] = runner.device().describe();
  doc["source"] = fmt::format("Loom's own kernels, {} steps of {} (loom bench --kernels-out)",
                              o.steps, o.config);
  doc["config"] = o.config;
  // a GPU's memory beside Loom's allocations and its kernels' scratch (each kernel's below): its
  // context, the libraries' code and workspaces
  if (const runtime::Device& d = runner.device(); !d.host_memory())
    doc["runtime_bytes"] =
        std::max<int64_t>(0, d.used_bytes() - d.peak_bytes() - d.scratch_reserved_bytes());
  doc["kernels"] = nlohmann::json::array();
  for (auto& [sig, e] : by_sig) {
    e.entry["count"] = double(e.calls) / steps;
    e.entry["seconds"] = e.seconds / double(e.calls);
    if (e.scratch > 0) e.entry["scratch_bytes"] = double(e.scratch);
    doc["kernels"].push_back(std::move(e.entry));
  }
  write_file_atomic(o.kernels_out, doc.dump(1) + "\n");
}

// The process's resident memory now (/proc/self/statm), 0 where it cannot be read.
int64_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  const bool ok = std::fscanf(f, "%lld %lld", &size, &resident) == 2;
  std::fclose(f);
  return ok ? resident * int64_t(sysconf(_SC_PAGESIZE)) : 0;
}

int bench_rank(const BenchOpts& o_, const train::Config& cfg, const runtime::MeshComms* comms) {
  const BenchOpts* o = &o_;
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  const int64_t baseline_rss = current_rss_bytes();  // the libraries loaded, no model yet
  train::ParamStore params(cfg.model);
  params.init_random(uint64_t(cfg.train.seed));
  train::StepRunner runner(cfg, params, train::StepRunner::Mode::train, comms);
  runner.release_params();  // a sharded rank keeps only its blocks of split parameters
  runtime::Trace trace;
  const Timed timed = time_steps(o_, cfg, runner, trace);
  const std::vector<double>& ms = timed.ms;
  const float loss = timed.loss;
  const runtime::Executor::CommStats &comm0 = timed.comm0, &comm1 = timed.comm1;
  const int64_t rows = runner.rows_per_step();
  const double exposed_ms = (comm1.exposed_seconds - comm0.exposed_seconds) * 1000.0 / o->steps;
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted.size() % 2
                      ? sorted[sorted.size() / 2]
                      : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  double tokens_per_step = double(rows * T);
  double fpt = models::train_flops_per_token(cfg.model, T);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  nlohmann::json j;
  j["config"] = o->config;
  j["arch"] = cfg.model.arch;
  j["dtype"] = std::string(dtype_name(cfg.model.dtype));
  j["threads"] = omp_get_max_threads();
  j["batch_size"] = B;
  j["grad_accum"] = cfg.train.grad_accum;
  j["seq_len"] = T;
  j["params"] = params.total_elements();
  j["steps"] = o->steps;
  j["tokens_per_s"] = tokens_per_step / (median / 1000.0);
  j["step_ms"] = {{"median", median}, {"min", sorted.front()}, {"max", sorted.back()}};
  j["model_flops_per_token"] = fpt;
  j["achieved_gflops"] = fpt * tokens_per_step / (median / 1000.0) / 1e9;
  j["planned_peak_bytes"] = runner.planned_peak_bytes();
  j["peak_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;
  // rank 0's process: resident with its libraries loaded and no model yet, and its peak above that
  j["baseline_rss_bytes"] = baseline_rss;
  j["peak_above_baseline_bytes"] = int64_t(ru.ru_maxrss) * 1024 - baseline_rss;
  j["device"] = runner.device().describe();
  // a GPU's memory: the most its allocations held at once (the executors' arenas and every bound
  // buffer; not cuBLASLt's 32 MiB workspace nor the reductions' stream-ordered scratch)
  // and all it holds by the driver's count (the CUDA context, the libraries' workspaces and the
  // stream-ordered pool too), after the steps
  if (!runner.device().host_memory()) {
    j["device_peak_bytes"] = runner.device().peak_bytes();
    j["device_used_bytes"] = runner.device().used_bytes();
    for (const auto& [name, bytes] : runner.device().memory_detail())
      j["device_memory_detail"][name] = bytes;
  }
  j["final_loss"] = loss;
  j["collectives_per_step"] = double(comm1.collectives - comm0.collectives) / o->steps;
  j["activation_bytes"] = runner.activation_bytes();
  // a Mixture-of-Experts model: of the last step's expert choices, the share dropped at capacity
  // (the work a step with drops does not do; a speed figure is read beside it)
  if (const auto& load = runner.router_load(); !load.kept.empty()) {
    double kept = 0, routed = 0;
    for (float k : load.kept) kept += k;
    for (float r : load.routed) routed += r;
    j["moe_dropped_fraction"] = routed > 0 ? (routed - kept) / routed : 0.0;
  }
  // per rank: planned bytes of parameters, gradients, moments and the whole step; measured peak RSS
  const train::StepRunner::StateBytes sb = runner.state_bytes();
  std::vector<int64_t> mine{sb.params,
                            sb.grads,
                            sb.moments,
                            runner.planned_peak_bytes(),
                            int64_t(ru.ru_maxrss) * 1024,
                            int64_t(exposed_ms * 1000.0)};  // microseconds
  std::vector<int64_t> all = mine;
  if (comms) {
    all.resize(mine.size() * size_t(comms->world().size()));
    comms->world().all_gather(mine.data(), all.data(), int64_t(mine.size() * 8));
    nlohmann::json tactics = nlohmann::json::array();
    for (const auto& t : cfg.plan.plan.tactics) tactics.push_back(t.kind + ":" + t.axis);
    j["plan"] = {
        {"mesh", cfg.plan.plan.mesh.to_string()}, {"tactics", tactics}, {"ranks", cfg.plan.ranks}};
    if (const shard::Tactic* pipe = shard::find_pipeline(cfg.plan.plan))
      j["pipeline"] = {{"schedule", pipe->schedule},
                       {"microbatches", shard::pipeline_microbatches(cfg.plan.plan, *pipe)},
                       {"virtual_stages", shard::pipeline_virtual_stages(*pipe)},
                       {"stages", cfg.plan.plan.mesh.axis_size(pipe->axis)}};
    j["passes"] = {
        {"bucket", passes::bucket_name(cfg.passes.bucket)},
        {"bucket_mb", cfg.passes.bucket_mb},
        {"reshard_after_forward", cfg.passes.reshard_after_forward},
        {"cast_before_gather", cfg.passes.cast_before_gather},
        {"reduce_dtype", passes::reduce_dtype_name(cfg.passes.reduce_dtype)},
        {"activation_reduce_dtype", passes::reduce_dtype_name(cfg.passes.activation_reduce_dtype)},
        {"recompute", passes::recompute_name(cfg.passes.recompute)},
        {"prefetch", cfg.passes.prefetch},
        {"max_in_flight", cfg.passes.max_in_flight}};
  }
  j["per_rank"] = nlohmann::json::array();
  const size_t ranks = all.size() / mine.size();
  double exposed_us = 0;  // summed over the ranks
  for (size_t r = 0; r < ranks; ++r) {
    const int64_t* x = &all[r * mine.size()];
    exposed_us += double(x[5]);
    j["per_rank"].push_back({{"param_bytes", x[0]},
                             {"grad_bytes", x[1]},
                             {"moment_bytes", x[2]},
                             {"planned_peak_bytes", x[3]},
                             {"peak_rss_bytes", x[4]},
                             {"exposed_comm_ms", double(x[5]) / 1000.0}});
  }
  // the time compute waited on communication, per step: the ranks' mean
  j["exposed_comm_ms"] = exposed_us / 1000.0 / double(ranks);
  j["exposed_comm_fraction"] = exposed_us / 1000.0 / double(ranks) / median;
  if (!o->trace.empty()) runtime::write_trace(o->trace, trace, comms);
  if (comms && comms->world().rank() != 0) return 0;
  fmt::print("{}\n", j.dump());
  if (o->profile) print_profile(o_, runner);
  if (!o->kernels_out.empty()) write_kernels(o_, runner);
  return 0;
}

}  // namespace

std::function<int()> add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* s = app.add_subcommand("bench", "time training steps on synthetic tokens (JSON)");
  s->add_option("config", o->config, "config TOML")->required();
  s->add_option("--steps", o->steps, "timed steps")->check(whole_number(1, 1 << 20));
  s->add_option("--warmup", o->warmup, "untimed steps first")->check(whole_number(0, 1 << 20));
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  s->add_flag("--profile", o->profile, "also print time per op (JSON, to stderr)");
  s->add_option("--kernels-out", o->kernels_out,
                "write the step's kernels with their measured seconds (JSON, for loom calibrate "
                "--import)");
  s->add_option("--trace", o->trace,
                "write the timed steps as a Chrome trace (per rank: compute and comm lanes)");
  return [o]() {
    train::Config cfg = train::load_config(o->config, o->sets);
    if (!o->trace.empty()) check_output("--trace", o->trace);
    if (!o->kernels_out.empty()) check_output("--kernels-out", o->kernels_out);
    return run_ranks(cfg,
                     [&](const runtime::MeshComms* comms) { return bench_rank(*o, cfg, comms); });
  };
}

}  // namespace loom::cli
