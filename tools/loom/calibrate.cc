// loom calibrate: measure this machine (or take kernels timed elsewhere) and write a cluster file
// (sim/cluster.h) whose [profile] the simulator predicts from. The work is calibrate/calibrate.h's;
// this file parses the flags and writes the result.
//
//   loom calibrate [--out clusters/local.toml] [--quick] [--idle-watts W] [--peak-watts W]
//   loom calibrate --import TIMED.json --base CLUSTER.toml --out F.toml
//                  [--compute-speed X --memory-speed Y]
//   loom calibrate --level NAME --launcher "mpirun ... -np N" --base CLUSTER.toml --out F.toml
//                  [--level-size S] [--shared-by K] [--quick]
#include "loom/calibrate/calibrate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "commands.h"
#include "loom/core/error.h"

namespace loom::cli {

namespace {

struct CalOpts {
  std::string out = "clusters/local.toml";
  calibrate::MeasureOptions measure;
  calibrate::ImportOptions import;
  calibrate::LevelOptions level;
  std::string level_worker;
  int64_t level_group = 0, level_inner = 1;
};

}  // namespace

std::function<int()> add_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalOpts>();
  CLI::App* s = app.add_subcommand("calibrate",
                                   "measure this machine's kernels and collectives "
                                   "and write a cluster file for loom plan");
  s->add_option("--out", o->out, "the cluster file to write (default clusters/local.toml)");
  s->add_flag("--quick", o->measure.quick, "a short sweep (a smoke test, not for predictions)");
  s->add_option("--idle-watts", o->measure.idle_watts,
                "a device's idle power (default: an estimate)")
      ->check(finite_number(0, 1e6));
  s->add_option("--peak-watts", o->measure.peak_watts,
                "a device's peak power (default: an estimate)")
      ->check(finite_number(0, 1e6));
  s->add_option("--import", o->import.timed,
                "kernels timed elsewhere (bench/gpu/torch_kernels.py, loom bench --kernels-out; "
                "several files: one profile): measure nothing, make them --base's [profile]");
  s->add_option("--base", o->import.base,
                "with --import or --level: the cluster file the profile or level is added to");
  s->add_option("--compute-speed", o->import.compute_speed,
                "with --import: the base device's compute speed over the measured one's")
      ->check(finite_number(1e-6, 1e6));
  s->add_option("--memory-speed", o->import.memory_speed,
                "with --import: the base device's memory speed over the measured one's")
      ->check(finite_number(1e-6, 1e6));
  s->add_option("--level", o->level.name,
                "measure this network level with ranks of an MPI job (--launcher) and put it in "
                "--base's levels");
  s->add_option("--launcher", o->level.launcher,
                "with --level: the mpirun command that starts the ranks, up to the program "
                "(\"mpirun --allow-run-as-root -np 2\"; each host's ranks consecutive)");
  s->add_option("--level-size", o->level.size,
                "with --level: the devices one group of it joins (default: the replaced level's, "
                "else 0: any number)")
      ->check(whole_number(0, 1 << 24));
  s->add_option("--shared-by", o->level.shared_by,
                "with --level: the devices that share one of its links (default: the replaced "
                "level's, else 1)")
      ->check(whole_number(1, 1 << 24));
  s->add_option("--level-worker", o->level_worker,
                "internal: run as a rank of --level's job, writing its result here")
      ->group("");
  s->add_option("--level-group", o->level_group,
                "internal: with --level-worker, the ranks of one group (0: all)")
      ->group("");
  s->add_option("--level-inner", o->level_inner,
                "internal: with --level-worker, the ranks of one group of the inner level")
      ->check(whole_number(1, 1 << 24))
      ->group("");
  CLI::Option* out_opt = s->get_option("--out");
  return [o, out_opt]() {
    if (!o->level_worker.empty()) {
      calibrate::level_worker(o->level_worker, o->measure.quick, o->level_group, o->level_inner);
      return 0;
    }
    if (!o->level.name.empty()) {
      o->level.base = o->import.base;
      o->level.quick = o->measure.quick;
      if (out_opt->count() == 0)
        throw Error("loom calibrate: --level needs --out (it would replace clusters/local.toml)");
      o->level.loom_binary = fmt::format("/proc/{}/exe", getpid());
      o->level.progress = [](const std::string& line) {
        fmt::print(stderr, "calibrate: {}\n", line);
      };
      const calibrate::Calibration c = calibrate::calibrate_level(o->level);
      sim::write_cluster(c.cluster, o->out, c.header);
      for (const sim::Level& l : c.cluster.levels)
        if (l.name == o->level.name)
          fmt::print(
              "wrote {}: level {} bandwidth {:.3g} B/s, latency {:.3g} s; on the communication "
              "thread a collective x{:.3g}, beside compute x{:.3g} more, compute x{:.3g} beside "
              "it\n",
              o->out, l.name, l.bandwidth, l.latency, l.comm_thread_slowdown, l.comm_beside_compute,
              l.compute_beside_comm);
      return 0;
    }
    if (!o->import.timed.empty()) {
      if (o->import.base.empty()) throw Error("loom calibrate: --import needs --base CLUSTER.toml");
      if (out_opt->count() == 0)
        throw Error("loom calibrate: --import needs --out (it would replace clusters/local.toml)");
      const calibrate::Calibration c = calibrate::import_timed(o->import);
      sim::write_cluster(c.cluster, o->out, c.header);
      fmt::print("wrote {} ({} matmul samples, {} ops from {})\n", o->out,
                 c.cluster.profile->matmul.size(), c.cluster.profile->ops.size(),
                 fmt::join(o->import.timed, ", "));
      return 0;
    }
    // an MPI rank's memory is measured by running this executable's `bench` under mpirun
    o->measure.loom_binary = fmt::format("/proc/{}/exe", getpid());
    o->measure.progress = [](const std::string& line) {
      fmt::print(stderr, "calibrate: {}\n", line);
    };
    const calibrate::Calibration c = calibrate::measure(o->measure);
    sim::write_cluster(c.cluster, o->out, c.header);
    const sim::Device& d = c.cluster.device;
    fmt::print(
        "wrote {} ({} matmul samples, {} ops, f32 peak {:.1f} GFLOP/s, memory {:.1f} GB/s, "
        "shm {:.2f} GB/s)\n",
        o->out, c.cluster.profile->matmul.size(), c.cluster.profile->ops.size(),
        d.peak_flops.at(DType::f32) / 1e9, d.memory_bandwidth / 1e9,
        c.cluster.levels.at(0).bandwidth / 1e9);
    return 0;
  };
}

}  // namespace loom::cli
