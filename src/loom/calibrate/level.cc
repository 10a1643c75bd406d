// A network level measured by ranks of an MPI job (calibrate.h: calibrate_level, level_worker).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "loom/calibrate/calibrate.h"
#include "loom/comm/mpi.h"
#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/runtime/comm_stream.h"
#include "loom/sim/cost.h"

namespace loom::calibrate {

namespace {

using Clock = std::chrono::steady_clock;

// Every rank's `v`, in rank order.
std::vector<float> each_rank(comm::Communicator& w, double v) {
  std::vector<float> all(size_t(w.size()), 0.0f);
  const float mine = float(v);
  w.all_gather(&mine, all.data(), sizeof(float));
  return all;
}

double slowest(comm::Communicator& w, double v) {
  const std::vector<float> all = each_rank(w, v);
  return double(*std::max_element(all.begin(), all.end()));
}

}  // namespace

void level_worker(const std::string& out, bool quick, int64_t group, int64_t inner) {
  comm::MpiSession session;
  auto world = comm::mpi_world();
  try {
    // the collectives run in every group of `group` consecutive ranks at once (SPMD, as a step
    // runs a level's collectives); barriers, the slowest rank and the means span them all
    comm::Communicator& all = *world;
    std::unique_ptr<comm::Communicator> sub;
    if (group > 0 && group < all.size()) {
      if (all.size() % group)
        throw Error(
            fmt::format("loom calibrate --level: {} ranks are not whole groups of the "
                        "level's size {}",
                        all.size(), group));
      sub = all.split(int(all.rank() / group), all.rank());
    }
    comm::Communicator& w = sub ? *sub : all;
    const int n = w.size();
    if (n < 2)
      throw Error("loom calibrate --level: the launcher started 1 rank; it needs 2 or more");
    runtime::CommStream stream;
    CollectiveBuffers buf;
    nlohmann::json j;
    j["ranks"] = n;
    j["groups"] = all.size() / n;
    const std::vector<int64_t> sizes =
        quick ? std::vector<int64_t>{int64_t(1) << 16, int64_t(1) << 20}
              : std::vector<int64_t>{int64_t(1) << 16, int64_t(1) << 20, int64_t(1) << 23,
                                     int64_t(1) << 26};
    const int reps = quick ? 2 : 5;
    // each kind at each size in every group of `g` at once
    auto measure = [&](comm::Communicator& g) {
      nlohmann::json m;
      for (const ir::Op op :
           {ir::Op::all_gather, ir::Op::reduce_scatter, ir::Op::all_reduce, ir::Op::all_to_all})
        for (int64_t b : sizes) {
          std::vector<double> ts;
          for (int r = 0; r < reps + 1; ++r) {
            all.barrier();
            const auto t0 = Clock::now();  // on this thread, as a program without a stream
            run_collective(g, op, b, buf);
            const double s = seconds_since(t0);
            if (r > 0) ts.push_back(slowest(all, s));
          }
          m[std::string(ir::op_name(op))].push_back({b, median(ts)});
        }
      return m;
    };
    j["comm"] = measure(w);
    // groups across: one rank of each inner group (a hierarchical reduction's middle step), where
    // the inner groups hold several ranks and the level several of them
    if (inner > 1 && n % inner == 0 && n / inner >= 2) {
      auto across = w.split(int(w.rank() % inner), w.rank());
      j["across"]["ranks"] = across->size();
      j["across"]["comm"] = measure(*across);
    }

    // Overlap: a collective on the stream beside GEMMs on this thread, against each alone. The
    // collective pair is an fsdp step's: an all_gather and a reduce_scatter of one buffer.
    const int64_t bytes = quick ? int64_t(1) << 20 : int64_t(16) << 20;
    const kernels::GemmDesc g{1, 256, 512, 512};
    std::vector<float> a(size_t(g.M * g.K), 0.5f), bm(size_t(g.K * g.N), 0.25f),
        c(size_t(g.M * g.N));
    auto gemm = [&] { kernels::cpu::gemm(g, a.data(), bm.data(), c.data()); };
    // the pair's seconds, on the calling thread
    auto fsdp_pair = [&] {
      const auto t0 = Clock::now();
      run_collective(w, ir::Op::all_gather, bytes / n, buf);
      run_collective(w, ir::Op::reduce_scatter, bytes, buf);
      return seconds_since(t0);
    };
    auto pair = [&](double* seconds) {
      return stream.submit([&, seconds] { *seconds = fsdp_pair(); });
    };
    for (int i = 0; i < 3; ++i) gemm();  // the primitive made, the caches warm
    std::vector<double> gemm_alone, comm_here, comm_alone, comm_beside, gemm_beside;
    for (int r = 0; r < 2 * reps + 1; ++r) {
      all.barrier();
      const auto t0 = Clock::now();
      const int k = quick ? 20 : 100;
      for (int i = 0; i < k; ++i) gemm();
      const double per_gemm = seconds_since(t0) / k;
      all.barrier();
      const double here = fsdp_pair();
      all.barrier();
      double alone = 0;
      stream.wait(pair(&alone));
      all.barrier();
      double beside = 0;
      const auto t1 = Clock::now();
      const int64_t ticket = pair(&beside);
      int done = 0;
      while (!stream.idle()) {
        gemm();
        ++done;
      }
      const double window = seconds_since(t1);
      stream.wait(ticket);
      if (r == 0 || done == 0) continue;
      gemm_alone.push_back(per_gemm);
      comm_here.push_back(here);
      comm_alone.push_back(alone);
      comm_beside.push_back(beside);
      gemm_beside.push_back(window / done);
    }
    auto mean_over_ranks = [&](double v) {
      double s = 0;
      for (float x : each_rank(all, v)) s += x;
      return s / double(all.size());
    };
    const double gemm_s = median(gemm_alone), comm_s = median(comm_alone);
    j["gemm_seconds"] = mean_over_ranks(gemm_s);
    j["overlap_bytes"] = bytes;
    j["comm_alone_seconds"] = mean_over_ranks(comm_s);
    const double here_s = median(comm_here);
    j["comm_thread_slowdown"] = mean_over_ranks(here_s > 0 ? std::max(1.0, comm_s / here_s) : 1.0);
    j["comm_beside_compute"] =
        mean_over_ranks(comm_s > 0 ? std::max(1.0, median(comm_beside) / comm_s) : 1.0);
    j["compute_beside_comm"] =
        mean_over_ranks(gemm_s > 0 ? std::max(1.0, median(gemm_beside) / gemm_s) : 1.0);

    // Skew: a step's collectives sit between kernels, and the ranks reach each one apart (the
    // system's noise, cores shared with other work, ranks of unequal speed): it starts when the
    // last arrives. A few GEMMs (a transformer sublayer's worth, ~kSkewGemms x 67 MFLOP) then a
    // small all_reduce, in a loop, against the GEMMs alone and the all_reduces back to back: each
    // rank's mean wait per collective beyond both, averaged over the ranks.
    constexpr int kSkewGemms = 8;
    const int64_t small = int64_t(1) << 16;
    const int loops = quick ? 5 : 40;
    std::vector<double> skews;
    for (int r = 0; r < reps + 1; ++r) {
      all.barrier();
      auto t0 = Clock::now();
      for (int i = 0; i < loops * kSkewGemms; ++i) gemm();
      const double gemms = seconds_since(t0) / loops;
      all.barrier();
      t0 = Clock::now();
      for (int i = 0; i < loops; ++i) run_collective(w, ir::Op::all_reduce, small, buf);
      const double collective = seconds_since(t0) / loops;
      all.barrier();
      t0 = Clock::now();
      for (int i = 0; i < loops; ++i) {
        for (int k = 0; k < kSkewGemms; ++k) gemm();
        run_collective(w, ir::Op::all_reduce, small, buf);
      }
      const double between = seconds_since(t0) / loops;
      if (r > 0) skews.push_back(std::max(0.0, between - gemms - collective));
    }
    j["skew_seconds"] = mean_over_ranks(median(skews));
    j["skew_gemm_seconds"] = mean_over_ranks(median(gemm_alone) * kSkewGemms);
    if (all.rank() == 0) {
      const std::string tmp = out + ".part";
      {
        std::ofstream f(tmp);
        f << j.dump(1) << "\n";
        if (!f) throw Error(fmt::format("loom calibrate: cannot write {}", tmp));
      }
      if (std::rename(tmp.c_str(), out.c_str()) != 0)
        throw Error(fmt::format("loom calibrate: cannot write {}", out));
    }
    all.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom calibrate: error on rank %d of %d: %s\n", world->rank(),
                 world->size(), e.what());
    std::fflush(stderr);
    comm::mpi_abort(1);
  }
}

Calibration calibrate_level(const LevelOptions& o) {
  if (o.name.empty()) throw Error("loom calibrate: --level needs a level name");
  if (o.launcher.empty())
    throw Error(
        "loom calibrate --level: needs --launcher \"mpirun ... -np N\" (the command that "
        "starts the ranks, each host's consecutive)");
  if (o.base.empty()) throw Error("loom calibrate --level: needs --base CLUSTER.toml");
  if (o.shared_by < 0)
    throw Error(fmt::format("loom calibrate: --shared-by must be >= 1, got {}", o.shared_by));
  Calibration r;
  r.cluster = sim::load_cluster(o.base);
  sim::Cluster& c = r.cluster;
  // where the level goes: in place of the base's level of that name, else outermost
  size_t at = c.levels.size();
  for (size_t i = 0; i < c.levels.size(); ++i)
    if (c.levels[i].name == o.name) at = i;
  if (at == c.levels.size() && c.levels.back().size == 0)
    throw Error(
        fmt::format("{}: its outermost level \"{}\" already spans any number of devices; "
                    "--level {} can only replace a level of that name, or give \"{}\" a "
                    "size",
                    o.base, c.levels.back().name, o.name, c.levels.back().name));

  char path[] = "/tmp/loom-level-XXXXXX.json";
  const int fd = mkstemps(path, 5);
  if (fd < 0) throw Error("loom calibrate: cannot create a temporary file in /tmp");
  close(fd);
  std::remove(path);
  // an inner level's groups (its size) all measure at once; the outermost's ranks are one group
  const int64_t level_size = o.size >= 0 ? o.size : at < c.levels.size() ? c.levels[at].size : 0;
  // the inner level's groups: their ranks consecutive
  const int64_t inner = at > 0 ? std::max<int64_t>(1, c.levels[at - 1].size) : 1;
  const std::string cmd = fmt::format(
      "{} -x OMP_NUM_THREADS '{}' calibrate --level-worker {} --level-group {} --level-inner {}{}",
      o.launcher, o.loom_binary, path, level_size, inner, o.quick ? " --quick" : "");
  if (o.progress) o.progress("running " + cmd);
  const int rc = std::system(cmd.c_str());
  nlohmann::json j;
  {
    std::ifstream in(path);
    if (rc != 0 || !in)
      throw Error(
          fmt::format("loom calibrate --level: the ranks failed (exit status {}): {}", rc, cmd),
          "run the launcher with `hostname` to check it starts its ranks");
    try {
      in >> j;
    } catch (const std::exception& e) {
      std::remove(path);
      throw Error(fmt::format("loom calibrate --level: the ranks' result {} is not JSON: {}", path,
                              e.what()));
    }
  }
  std::remove(path);
  const int64_t n = j.at("ranks").get<int64_t>();

  sim::Level lv;
  lv.name = o.name;
  lv.size = level_size;
  // unless given, the replaced level's links are shared as they were
  lv.shared_by = o.shared_by > 0 ? o.shared_by : at < c.levels.size() ? c.levels[at].shared_by : 1;
  lv.comm_beside_compute = j.at("comm_beside_compute").get<double>();
  lv.compute_beside_comm = j.at("compute_beside_comm").get<double>();
  lv.comm_thread_slowdown = j.at("comm_thread_slowdown").get<double>();
  lv.skew = j.at("skew_seconds").get<double>();
  // the ranks' ring crosses the level (which ranks share a link: each host's consecutive)
  std::vector<sim::Level> levels(c.levels.begin(), c.levels.begin() + long(at));
  levels.push_back(lv);
  sim::Cluster probe = c;
  probe.levels = levels;
  probe.levels.back().bandwidth = 1;
  const shard::Mesh world({{"ranks", n}});
  const sim::Placement pl = sim::place(world, probe, n);
  if (pl.level.at("ranks") != int(at))
    throw Error(
        fmt::format("loom calibrate --level {}: the {} ranks lie within level \"{}\" "
                    "(size {}); calibrating a level needs ranks across it",
                    o.name, n, probe.levels[size_t(pl.level.at("ranks"))].name,
                    probe.levels[size_t(pl.level.at("ranks"))].size));
  const double load = sim::link_load(ir::Op::all_reduce, world, probe, int(at), "ranks");
  // each kind's ring, t = steps * latency + load * wire / bandwidth, fitted to its samples:
  // all_gather and reduce_scatter give the level's bandwidth (their mean), all_reduce
  // its own where it differs by more than 5%, the latency the median of the three
  struct Fit {
    double bandwidth = 0, latency = 0, big = 0;
  };
  auto fit = [&](ir::Op op) {
    std::vector<std::pair<double, double>> xs;
    for (const auto& s : j.at("comm").at(std::string(ir::op_name(op))))
      xs.push_back({s.at(0).get<double>(), s.at(1).get<double>()});
    std::sort(xs.begin(), xs.end());
    if (xs.empty())
      throw Error(fmt::format("loom calibrate --level: the ranks measured no {}", op));
    const double steps = double(n - 1) * (op == ir::Op::all_reduce ? 2 : 1);
    // t = a + b w by least squares in relative error (weights 1/t^2): every size counts alike
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [bytes, t] : xs) {
      const double x = load * sim::collective_wire_bytes(op, bytes, n), wt = 1 / (t * t);
      sw += wt, sx += wt * x, sy += wt * t, sxx += wt * x * x, sxy += wt * x * t;
    }
    const double det = sw * sxx - sx * sx;
    double per_byte = det > 0 ? (sw * sxy - sx * sy) / det : 0;
    double a = det > 0 ? (sy - per_byte * sx) / sw : 0;
    if (!(per_byte > 0)) {  // no slope to fit: the largest sample's rate, no latency
      per_byte = xs.back().second / (load * sim::collective_wire_bytes(op, xs.back().first, n));
      a = 0;
    }
    return Fit{1 / per_byte, std::max(1e-7, a / steps), xs.back().first};
  };
  const Fit ag = fit(ir::Op::all_gather), rs = fit(ir::Op::reduce_scatter),
            ar = fit(ir::Op::all_reduce);
  lv.bandwidth = (ag.bandwidth + rs.bandwidth) / 2;
  if (std::abs(ar.bandwidth / lv.bandwidth - 1) > 0.05) lv.all_reduce_bandwidth = ar.bandwidth;
  std::vector<double> lat{ag.latency, rs.latency, ar.latency};
  std::sort(lat.begin(), lat.end());
  lv.latency = lat[1];
  // the collectives as measured, the whole groups' and those across the inner level's
  auto keep = [&](const nlohmann::json& comm, int64_t ranks) {
    for (const auto& [name, samples] : comm.items())
      for (const auto& s : samples)
        lv.comm[ir::parse_op(name)].push_back(
            {ranks, s.at(0).get<double>(), s.at(1).get<double>()});
  };
  keep(j.at("comm"), n);
  std::string across;
  if (j.contains("across")) {
    const int64_t k = j["across"].at("ranks").get<int64_t>();
    keep(j["across"].at("comm"), k);
    across = fmt::format(", and in groups of {} across the inner level's (one rank of each)", k);
  }
  if (at < c.levels.size()) {
    c.levels[at] = lv;
  } else {
    c.levels.push_back(lv);
  }
  r.header = fmt::format(
      "# {} with level \"{}\" measured by `loom calibrate --level` ({} ranks: {}):\n"
      "# bus bandwidth all_gather {:.4g}, reduce_scatter {:.4g}, all_reduce {:.4g} B/s (64 KiB "
      "to {:.0f} MiB, least squares; each kept as [level.comm]{}); an fsdp pair of {:.0f} MiB on "
      "the communication thread x{:.3g}, beside GEMMs: collective x{:.3g}, GEMM x{:.3g}; a "
      "collective after {:.2g} ms of GEMMs waits {:.3g} ms for its last rank (skew).\n",
      o.base, o.name, n, o.launcher, ag.bandwidth, rs.bandwidth, ar.bandwidth, ar.big / 1048576,
      across, j.at("overlap_bytes").get<double>() / 1048576, lv.comm_thread_slowdown,
      lv.comm_beside_compute, lv.compute_beside_comm, j.at("skew_gemm_seconds").get<double>() * 1e3,
      lv.skew * 1e3);
  return r;
}

}  // namespace loom::calibrate
