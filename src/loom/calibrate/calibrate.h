// Calibration: this machine measured (or kernels another machine timed) as a cluster file whose
// [profile] the simulator predicts from (sim/cluster.h, sim/profile.h). The front door of
// `loom calibrate`, which only parses flags, calls one of the two and writes the result.
//
// measure(), with this process's OpenMP threads (one device = one rank of that many threads):
//   - the f32 and bf16 arithmetic peak (kernels/cpu/peak.h);
//   - every kernel a training step runs, by profiling training steps of a sweep of small Llama and
//     GPT-2 shapes (1 layer; d_model 128, 384, 768; 2x128, 4x256, 6x512 tokens; vocabularies 4096
//     and 16384; f32 and bf16), with the machine's other devices busy: each node's median time
//     becomes a sample of its op (matmuls by transposes and shape; the others by the bytes they
//     move, attention by its FLOPs). The sweep avoids the bench models' shapes, so predicting
//     them is a prediction;
//   - the memory bandwidth (the fastest streaming op's bytes per second);
//   - collectives (all_gather, reduce_scatter, all_reduce, all_to_all) on 2 and 4 ranks of this
//     process (comm/local.h), 64 KiB to 64 MiB per rank: the [profile.comm] samples the simulator
//     uses for the innermost level, and that level's bandwidth and latency;
//   - the memory a process and an MPI rank hold beside their planned tensors.
// Power is not measured (no meter here): idle and peak watts default to an estimate documented in
// docs/simulator.md.
//
// import_timed() measures nothing: it reads the kernels another machine timed (a GPU's, by
// bench/gpu/torch_kernels.py from `loom plan --kernels`) and makes them the [profile] of a base
// cluster file (its device, levels and efficiency model kept for what the profile lacks). Speed
// ratios carry the timings to a device that was not measured: the base's device computes X times
// and moves memory Y times as fast as the one that timed them, so a compute-bound kernel (matmul,
// grouped_matmul, attention and its backward) takes 1/X of the time measured and every other
// kernel 1/Y; the cluster is then named "-derived", not "-measured".
//
// Not here: writing the file (sim::write_cluster), the simulation itself (sim/simulate.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/ir/op.h"
#include "loom/sim/cluster.h"

namespace loom::comm {
class Communicator;
}

namespace loom::calibrate {

// A cluster and the comment that heads its file (how it was made).
struct Calibration {
  sim::Cluster cluster;
  std::string header;
};

struct MeasureOptions {
  bool quick = false;                       // a short sweep: a smoke test, not for predictions
  double idle_watts = -1, peak_watts = -1;  // per device; < 0: the estimate
  // The loom executable: `loom bench` of a 2-rank plan under mpirun measures what an MPI rank holds
  // beside its tensors. Empty, or mpirun failing: a rank is taken to hold what one process does.
  std::string loom_binary;
  std::function<void(const std::string&)> progress;  // a line per step measured; null: silent
};

// Measures this machine (see above). Throws loom::Error for contradictory options (peak watts
// below idle) or a machine whose memory size cannot be read.
Calibration measure(const MeasureOptions& o);

struct ImportOptions {
  // bench/gpu/torch_kernels.py's or loom bench --kernels-out's JSON; several files (one device's,
  // e.g. one per model) make one profile
  std::vector<std::string> timed;
  std::string base;                            // the cluster file the profile is added to
  double compute_speed = 1, memory_speed = 1;  // the base device's over the measured one's; > 0
};

// The base cluster with the timed kernels as its profile. Throws loom::Error naming the file and
// the entry (kernels[i]) for anything it cannot read, and the files when they name different
// devices.
Calibration import_timed(const ImportOptions& o);

// A network level as ranks of an MPI job see it (`loom calibrate --level NAME --launcher CMD
// --base F.toml`): `launcher` (an Open MPI mpirun command line up to the program, e.g. "mpirun
// --allow-run-as-root -np 2", or one that starts the ranks on two hosts; each host's ranks
// consecutive) runs `loom calibrate --level-worker` on its ranks, which measure all_gather,
// reduce_scatter, all_reduce and all_to_all over all of them (a level of size S < the ranks: in
// every group of S consecutive ranks at once), 64 KiB to 64 MiB per rank, on the
// compute thread (as a program without a communication stream runs them); and an fsdp pair (an
// all_gather and a reduce_scatter of 16 MiB) there, on the communication thread
// (runtime/comm_stream.h: polite waits) alone, and there beside GEMMs on the compute thread
// against the GEMMs alone. Each kind's ring (t = steps latency + load wire / bandwidth, the load of
// the ranks' ring: cost.h) is fitted to its samples by least squares in relative error: the level's
// bandwidth is all_gather's and reduce_scatter's mean, all_reduce_bandwidth all_reduce's where it
// differs by over 5%, the latency the median of the three; its comm_thread_slowdown,
// comm_beside_compute and compute_beside_comm from the overlap (the mean over ranks of the median
// of 10). Every measured collective is kept as the level's samples (Level::comm), with those of
// the groups across the inner level's (one rank of each, all at once), which the simulator costs
// by what was measured for their rank count. The level replaces the base's level of that name, or
// is added outermost.
struct LevelOptions {
  std::string name, launcher, base;
  int64_t size = -1;      // the level's size; < 0: the replaced level's, else 0 (any number)
  int64_t shared_by = 0;  // devices that share one of its links; 0: the replaced level's, else 1
  bool quick = false;
  std::string loom_binary;  // the loom executable the launcher runs
  std::function<void(const std::string&)> progress;
};
// Throws loom::Error naming the flag, the base file or the launcher's failure; a launcher whose
// ranks all lie inside an inner level is refused (they would not cross this one).
Calibration calibrate_level(const LevelOptions& o);
// The ranks' side (each a process of the launcher's job): measures as above and, on rank 0,
// writes the JSON to `out` (atomically). An error on any rank aborts the job.
// The collectives run within every group of `group` consecutive ranks at once (the level's size:
// an inner level's groups all busy, as in a step; 0: all the ranks one group), then, where the
// inner level's groups hold `inner` > 1 consecutive ranks, within the groups of one rank of each
// (ranks equal modulo `inner`), again all at once.
void level_worker(const std::string& out, bool quick, int64_t group, int64_t inner);

// The pieces, for tests.
// The timed kernels of `path` as a profile (the matmuls by shape, the others by bytes), scaled by
// the speed ratios; the JSON's device, what timed them (its "source": `loom bench --kernels-out`
// writes one, Loom's own kernels; else bench/gpu/torch_kernels.py with its "torch" version), and
// the runtime's own device memory where the file measured it ("runtime_bytes"; else -1).
struct TimedKernels {
  sim::Profile profile;
  std::string device, source;
  double runtime_bytes = -1;
};
TimedKernels read_timed(const std::string& path, double compute_speed, double memory_speed);
// Median seconds of one collective `op` of `bytes` per rank on n ranks of this process.
double time_collective(ir::Op op, int n, int64_t bytes, int reps);
// One collective `op` (all_gather, reduce_scatter, all_reduce, all_to_all) of `bytes` of f32 per
// rank (its input) on `c`, in buffers kept between calls.
struct CollectiveBuffers {
  std::vector<float> in, out;
};
void run_collective(comm::Communicator& c, ir::Op op, int64_t bytes, CollectiveBuffers& b);
// One sample per distinct shape: the median of the samples that had it.
void dedupe(sim::Profile& p);
double median(std::vector<double> v);  // the upper median; 0 for none

}  // namespace loom::calibrate
