// measure (calibrate.h): this machine's kernels, collectives, peak and memory.
#include <fmt/format.h>
#include <omp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "loom/calibrate/calibrate.h"
#include "loom/comm/local.h"
#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/peak.h"
#include "loom/models/architecture.h"
#include "loom/ops/linear.h"
#include "loom/ops/op.h"
#include "loom/sim/cost.h"
#include "loom/train/memory.h"
#include "loom/train/step.h"

namespace loom::calibrate {

namespace {

struct Shape1 {
  std::string arch;
  int64_t d, vocab, batch, seq;
  DType dtype;
};

// A one-layer model of shape s (heads of 64), for one process.
train::Config small_config(const Shape1& s) {
  train::Config cfg;
  cfg.path = "loom calibrate";
  cfg.model.arch = s.arch;
  cfg.model.vocab_size = s.vocab;
  cfg.model.d_model = s.d;
  cfg.model.n_layers = 1;
  cfg.model.n_heads = std::max<int64_t>(1, s.d / 64);
  cfg.model.n_kv_heads = cfg.model.n_heads;
  cfg.model.ffn_hidden = 0;  // the architecture's default
  cfg.model.max_seq_len = s.seq;
  cfg.model.dtype = s.dtype;
  cfg.model.validate(cfg.path);
  cfg.train.batch_size = s.batch;
  cfg.train.seq_len = s.seq;
  return cfg;
}

// Profiles `reps` training steps of one small model; appends a sample per node.
void profile_model(const Shape1& s, int reps, sim::Profile& prof) {
  const train::Config cfg = small_config(s);
  train::ParamStore params(cfg.model);
  params.init_random(1);
  train::StepRunner runner(cfg, params, train::StepRunner::Mode::train, nullptr);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(s.vocab - 1));
  std::vector<int32_t> tokens(size_t(s.batch * (s.seq + 1)));
  for (auto& t : tokens) t = tok(rng);
  runner.step(tokens.data());  // warm: oneDNN primitives created, pages touched
  runtime::Executor& ex = runner.executor();
  const ir::Graph& g = ex.graph();
  std::vector<std::vector<double>> times(g.nodes().size());
  ex.set_profiling(true);
  for (int r = 0; r < reps; ++r) {
    std::vector<double> before(g.nodes().size());
    for (size_t i = 0; i < before.size(); ++i) before[i] = ex.node_times()[i].seconds;
    runner.step(tokens.data());
    for (size_t i = 0; i < before.size(); ++i)
      times[i].push_back(ex.node_times()[i].seconds - before[i]);
  }
  ex.set_profiling(false);
  for (const ir::Node& n : g.nodes()) {
    if (ops::has_trait(n.op, ops::Trait::view)) continue;
    const double t = median(times[size_t(n.id)]);
    const DType dt = sim::node_dtype(g, n);
    if (n.op == ir::Op::matmul) {
      const ops::MatmulDims d = ops::matmul_dims(g, n);
      prof.matmul.push_back({int64_t(d.ta), int64_t(d.tb), d.M, d.N, d.K, d.batch, dt, t});
      continue;
    }
    const ops::OpDef& def = ops::op_def(n.op);
    const ops::Cost c = def.cost ? def.cost(g, n) : ops::Cost{};
    prof.ops[n.op].push_back({dt, c.bytes_read + c.bytes_written, c.flops, t});
  }
}

// A process's own memory: its peak RSS after a tiny training step less what the step's memory plan
// holds (libraries, oneDNN's and OpenMP's state, thread stacks).
double process_baseline() {
  const train::Config cfg = small_config({"llama", 64, 256, 2, 32, DType::f32});
  train::ParamStore params(cfg.model);
  params.init_random(1);
  train::StepRunner runner(cfg, params, train::StepRunner::Mode::train, nullptr);
  std::vector<int32_t> tokens(size_t(2 * 33), 1);
  runner.step(tokens.data());
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024 - double(runner.planned_peak_bytes());
}

// The same for a rank of an MPI job: `loom bench` of a tiny 2-rank data-parallel plan under
// mpirun (MPI's own buffers and shared-memory segments included), run as `loom`; < 0 when mpirun
// cannot run it.
double mpi_rank_baseline(const std::string& loom) {
  if (loom.empty()) return -1;
  char path[] = "/tmp/loom-calibrate-XXXXXX.toml";
  const int fd = mkstemps(path, 5);
  if (fd < 0) return -1;
  close(fd);
  const std::string cfg = path;
  {
    std::ofstream out(cfg);
    out << "[model]\narch = \"llama\"\nvocab_size = 256\nd_model = 64\nn_layers = 1\n"
           "n_heads = 1\nmax_seq_len = 32\n[train]\nbatch_size = 2\nseq_len = 32\n"
           "[plan]\nmesh = { data = 2 }\ntactics = [{ kind = \"data\", axis = \"data\" }]\n";
  }
  const std::string cmd =
      "timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x "
      "OMP_NUM_THREADS '" +
      loom + "' bench " + cfg + " --steps 1 --warmup 1 2>/dev/null";
  std::string text;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, f)) text.append(buf, n);
    pclose(f);
  }
  std::remove(cfg.c_str());
  // the JSON line: the last one that starts with '{'
  size_t at = std::string::npos;
  for (size_t p = 0; p < text.size(); p = text.find('\n', p) + 1) {
    if (text[p] == '{') at = p;
    if (text.find('\n', p) == std::string::npos) break;
  }
  if (at == std::string::npos) return -1;
  try {
    const auto j = nlohmann::json::parse(text.substr(at, text.find('\n', at) - at));
    double worst = 0;
    for (const auto& r : j.at("per_rank"))
      worst = std::max(
          worst, r.at("peak_rss_bytes").get<double>() - r.at("planned_peak_bytes").get<double>());
    return worst;
  } catch (const std::exception&) {
    return -1;
  }
}

// The other devices of this machine at work while one is measured, as they are in a plan that uses
// them all (they share the L3 cache and the memory bandwidth): `n` forked processes running the
// same sweep until stopped. A child dies with its parent (PR_SET_PDEATHSIG), so a calibrate that
// is killed or aborts leaves none behind. Forked only when a device is one thread, so the children
// start from a process whose OpenMP runtime has no worker threads.
class Neighbours {
 public:
  Neighbours(int n, const std::vector<Shape1>& sweep) {
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);  // the parent died before the line above
        try {
          for (;;)
            for (const Shape1& s : sweep) {
              sim::Profile scratch;
              profile_model(s, 1, scratch);
            }
        } catch (...) {
        }
        _exit(0);
      }
      if (pid > 0)
        pids_.push_back(pid);
      else
        fmt::print(stderr, "calibrate: fork failed ({}): measuring with fewer busy neighbours\n",
                   std::strerror(errno));
    }
  }
  ~Neighbours() {
    for (pid_t p : pids_) kill(p, SIGKILL);
    for (pid_t p : pids_) waitpid(p, nullptr, 0);
  }

 private:
  std::vector<pid_t> pids_;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown CPU";
}

}  // namespace

void run_collective(comm::Communicator& c, ir::Op op, int64_t bytes, CollectiveBuffers& b) {
  const int n = c.size();
  const int64_t count = bytes / 4;
  b.in.resize(size_t(count), 1.0f);
  b.out.resize(size_t(op == ir::Op::all_gather ? count * n : count));
  if (op == ir::Op::all_gather)
    c.all_gather(b.in.data(), b.out.data(), bytes);
  else if (op == ir::Op::reduce_scatter)
    c.reduce_scatter(b.in.data(), b.out.data(), count / n, DType::f32);
  else if (op == ir::Op::all_reduce)
    c.all_reduce(b.in.data(), count, DType::f32);
  else
    c.all_to_all(b.in.data(), b.out.data(), bytes / n);
}

double time_collective(ir::Op op, int n, int64_t bytes, int reps) {
  std::vector<double> result(1);
  comm::run_local(n, [&](comm::Communicator& c) {
    CollectiveBuffers buf;
    std::vector<double> ts;
    for (int r = 0; r < reps + 1; ++r) {
      c.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      run_collective(c, op, bytes, buf);
      c.barrier();
      if (r > 0) ts.push_back(seconds_since(t0));
    }
    if (c.rank() == 0) result[0] = median(ts);
  });
  return result[0];
}

Calibration measure(const MeasureOptions& o) {
  if (o.idle_watts >= 0 && o.peak_watts >= 0 && o.peak_watts < o.idle_watts)
    throw Error(fmt::format("loom calibrate: --peak-watts {} is below --idle-watts {}",
                            o.peak_watts, o.idle_watts));
  auto progress = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };
  const int threads = omp_get_max_threads();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  Calibration r;
  sim::Cluster& c = r.cluster;
  c.name = "local";
  const std::string cpu = cpu_model();
  c.device.name = fmt::format("{} ({} thread{})", cpu, threads, threads > 1 ? "s" : "");
  c.device.cores = cores;
  c.devices_per_node = std::max<int64_t>(1, cores / threads);
  c.device.runtime_bytes = process_baseline();
  // kernels are measured with every other device of the machine busy too
  const bool bf16_ok = kernels::has_bf16_peak();
  std::vector<Shape1> sweep;
  for (DType dt : {DType::f32, DType::bf16}) {
    if (dt == DType::bf16 && !bf16_ok) continue;
    for (const std::string& arch : models::architecture_names())
      for (int64_t d : o.quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 384, 768})
        for (auto [b, t] :
             o.quick ? std::vector<std::pair<int64_t, int64_t>>{{2, 64}}
                     : std::vector<std::pair<int64_t, int64_t>>{{2, 128}, {4, 256}, {6, 512}})
          for (int64_t v : o.quick ? std::vector<int64_t>{512} : std::vector<int64_t>{4096, 16384})
            sweep.push_back({arch, d, v, b, t, dt});
  }
  sim::Profile prof;
  prof.threads = threads;
  {
    Neighbours busy(o.quick ? 0 : int(c.devices_per_node - 1), sweep);
    const long iters = o.quick ? 2000000 : 20000000;
    c.device.peak_flops[DType::f32] = kernels::fma_peak_gflops(threads, iters, false) * 1e9;
    if (bf16_ok)
      c.device.peak_flops[DType::bf16] = kernels::fma_peak_gflops(threads, iters, true) * 1e9;
    const int reps = o.quick ? 1 : 3;
    for (size_t i = 0; i < sweep.size(); ++i) {
      const Shape1& sh = sweep[i];
      progress(fmt::format("kernels {}/{}: {} d_model {} vocab {} batch {}x{} {}", i + 1,
                           sweep.size(), sh.arch, sh.d, sh.vocab, sh.batch, sh.seq,
                           dtype_name(sh.dtype)));
      profile_model(sh, reps, prof);
    }
  }
  c.device.memory_bytes = double(train::machine_memory_bytes()) / double(c.devices_per_node);
  if (!(c.device.memory_bytes > 0))
    throw Error("loom calibrate: cannot read this machine's memory size from /proc/meminfo");
  // what a rank of an MPI job holds beside its planned tensors (one process's: measured first,
  // while this process's peak RSS is still its own baseline)
  c.device.rank_runtime_bytes = mpi_rank_baseline(o.loom_binary);
  if (c.device.rank_runtime_bytes < 0) {
    progress(
        "mpirun could not run a 2-rank bench; MPI ranks are taken to hold what one process "
        "does");
    c.device.rank_runtime_bytes = c.device.runtime_bytes;
  }
  c.device.kernel_overhead = 1e-6;
  // ~4 W per busy Zen 4 core (a 280 W, 64-core EPYC at full load), a third of it idle
  c.device.peak_watts = o.peak_watts >= 0 ? o.peak_watts : 4.4 * threads;
  c.device.idle_watts = o.idle_watts >= 0 ? o.idle_watts : c.device.peak_watts / 3;
  if (o.peak_watts < 0) c.device.peak_watts = std::max(c.device.peak_watts, c.device.idle_watts);
  c.pue = 1.2;
  c.carbon_intensity = 0.4;
  dedupe(prof);
  // the streaming bandwidth of the largest add (out of cache)
  double bw = 0, largest = 0;
  for (const auto& x : prof.ops[ir::Op::add])
    if (x.seconds > 0 && x.bytes >= largest) largest = x.bytes, bw = x.bytes / x.seconds;
  c.device.memory_bandwidth = bw > 0 ? bw : 1e10;

  const std::vector<int64_t> sizes = o.quick
                                         ? std::vector<int64_t>{int64_t(1) << 16}
                                         : std::vector<int64_t>{int64_t(1) << 16, int64_t(1) << 20,
                                                                int64_t(1) << 23, int64_t(1) << 26};
  double level_bw = 0, level_lat = 1;
  for (const ir::Op op :
       {ir::Op::all_gather, ir::Op::reduce_scatter, ir::Op::all_reduce, ir::Op::all_to_all})
    for (int n : {2, 4})
      for (int64_t b : sizes) {
        progress(fmt::format("{} on {} ranks, {} bytes", op, n, b));
        const double t = time_collective(op, n, b, o.quick ? 2 : 5);
        prof.comm[op].push_back({n, double(b), t});
        if (op == ir::Op::all_reduce && n == 2) {
          level_bw = std::max(level_bw, sim::collective_wire_bytes(op, double(b), n) / t);
          level_lat = std::min(level_lat, t / 2);
        }
      }
  c.levels.push_back({"shm", 0, level_bw, level_lat});
  c.profile = prof;
  r.header = fmt::format(
      "# This machine as `loom calibrate{}` measured it (OMP_NUM_THREADS={}; {}).\n"
      "# Peak FLOP/s: kernels/cpu/peak.h; [profile]: kernel and collective times "
      "(sim/profile.h);\n"
      "# power: an estimate, not measured (docs/simulator.md). Units: SI.\n",
      o.quick ? " --quick" : "", threads, cpu);
  return r;
}

}  // namespace loom::calibrate
