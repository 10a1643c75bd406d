// The simulator: an event simulation of one rank's scheduled program (the same shard::Program the
// executor runs) on a cluster, and what it predicts. No tensor is allocated: a program of any size
// costs its node count.
//
// Two streams, as runtime::Executor runs them: the compute stream takes the nodes in program
// order; a collective in a program with asynchronous collectives (passes/prefetch.cc) is queued on
// the communication stream (FIFO: it starts when issued and when the one before it ends) and the
// compute stream meets it at its wait (at once, for a synchronous one); in a program without, it
// runs on the compute stream. On the communication stream a collective takes its level's
// comm_thread_slowdown times as long (polite waits), and while it runs beside a kernel, each takes
// its level's comm_beside_compute / compute_beside_comm times as long (a CPU host's communication
// thread and network stack share the cores with compute; 1 on a GPU). Exposed communication is the
// time the compute stream waits. Collectives of one step that cross a shared link at once divide it
// (cost.h: link_load). The
// program is SPMD: every rank runs the same nodes on blocks of the same shapes, so rank 0's
// program stands for all, and a collective's time is its slowest member's (symmetric on a ring).
//
// Memory is the program's memory plan (runtime::plan_memory: arena + bound tensors, in-flight
// buffers included), plus the communicator's largest temporaries, plus the device's stated
// runtime_bytes (a process's own: libraries, thread stacks, MPI's buffers).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "loom/shard/lower.h"
#include "loom/sim/cluster.h"

namespace loom::sim {

// One step's collectives per mesh axis and op: how many, and the bytes of their whole buffers
// (all_gather: what arrives; reduce_scatter, all_reduce, all_to_all: what goes in), as
// `loom inspect --stage scheduled` prints them.
struct AxisTraffic {
  int64_t count = 0;
  double bytes = 0;
};
std::map<std::string, std::map<std::string, AxisTraffic>> traffic(const ir::Graph& g);

struct Prediction {
  double step_seconds = 0;
  double compute_seconds = 0;       // the compute stream's busy time
  double comm_seconds = 0;          // collectives' summed durations
  double exposed_comm_seconds = 0;  // the compute stream waiting for them
  // exposed_comm_seconds by what the compute stream waited for: "<op> <axis>" (a collective's kind
  // and axis: "all_gather model"; "recv pipe" is a pipeline stage waiting for its peer)
  std::map<std::string, double> exposed_by;
  double flops = 0;                        // executed per rank (ops::Cost, recomputation included)
  std::map<ir::Op, double> compute_by_op;  // the compute stream's seconds per op
  int64_t collectives = 0;
  std::map<std::string, AxisTraffic> axis_traffic;  // per axis, all collective kinds together
  std::map<std::string, double> level_bytes;        // per level: bytes one rank sends on it
  int64_t planned_bytes = 0;                        // the memory plan's peak: arena + bound
  int64_t scratch_bytes = 0;  // the largest temporaries: a collective's, a kernel's (cost.h)
  int64_t peak_bytes = 0;     // planned + scratch + the runtime's own (device.runtime_bytes)
};

struct SimOptions {
  // >= 1: stretches compute (ranks sharing cores: more ranks x threads than the machine has)
  double oversubscription = 1;
  // ranks are processes of an MPI job (device.rank_runtime_bytes each, MPI's scratch), not
  // threads of one process (ranks = "local") or one process alone (device.runtime_bytes)
  bool mpi_ranks = true;
  // false: time only (planned_bytes and peak_bytes stay 0); the memory plan is the
  // costly part of a large program, and bucket = "auto" compares candidates by time
  bool memory = true;
  // the program's first `nodes` nodes only (-1: all): a micro-batch before a step's last under
  // gradient accumulation (passes/micro_batch.cc)
  int64_t nodes = -1;
  // simulate(): a pipeline stage's recv finds its message there when it asks (the stage alone,
  // without its peers' timing: bucket = "auto" comparing one stage's merges); false: an error
  bool messages_ready = false;
};

// Simulates one step of a rank's program `g` (compiled under `mesh`) on cluster c with the axes
// placed by p. Throws loom::Error for a pipeline stage's program (it receives from another)
// unless o.messages_ready.
Prediction simulate(const ir::Graph& g, const shard::Mesh& mesh, const Cluster& c,
                    const Placement& p, const SimOptions& o = {});

// A pipeline's stages (passes/pipeline_stages.cc), one program each, side by side: each runs as
// simulate() runs one, and a recv waits until its message arrives: the send's end on its stage
// plus the axis level's latency and bytes / bandwidth (a point-to-point transfer, beside
// whatever else the link carries). The bubbles are the stages' waits (exposed_comm_seconds).
// Returns each stage's prediction; the step ends with the last.
using Messages = std::map<std::tuple<int64_t, int64_t, int64_t>, double>;  // (from, to, tag) -> t
std::vector<Prediction> simulate_pipeline(const std::vector<const ir::Graph*>& stages,
                                          const shard::Mesh& mesh, const Cluster& c,
                                          const Placement& p, const SimOptions& o = {});

}  // namespace loom::sim
