// A cluster file (clusters/*.toml): what the simulator knows about the machines a plan runs on. The
// format is documented in docs/simulator.md; every key is checked, and an unknown or missing one is
// an error naming the file and the key.
//
//   [device]   one rank's compute: peak FLOP/s per dtype, memory capacity and bandwidth, idle and
//              peak power, the runtime's own memory (a process's or a CUDA context's)
//   [[level]]  the network, innermost first: the group of devices a level joins (size), each
//              device's bandwidth on it and the latency of one message (NVLink in a node, the NICs
//              across nodes, a WAN between islands); the last level may span any number of devices
//   [profile]  optional, written by `loom calibrate`: measured kernel times (profile.h); without
//              it the efficiency model stands in (docs/simulator.md)
//   pue, carbon_intensity, devices_per_node, devices: for energy and for `loom plan`'s defaults
//
// Units are SI throughout: FLOP/s, bytes, bytes/s, seconds, watts, kg CO2e per kWh.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/shard/sharding.h"
#include "loom/sim/profile.h"

namespace loom::sim {

struct Device {
  std::string name;
  std::map<DType, double> peak_flops;  // dense, per dtype (f32, bf16)
  double memory_bytes = 0;
  double memory_bandwidth = 0;  // bytes/s
  double idle_watts = 0, peak_watts = 0;
  double runtime_bytes = 0;  // memory the runtime holds beside the planned tensors (one process)
  double rank_runtime_bytes =
      -1;                      // the same for a rank of a multi-process job (MPI); < 0: as above
  double kernel_overhead = 0;  // seconds per kernel launch (the efficiency model's fixed cost)
  int64_t cores = 0;  // CPU cores all ranks share (this machine); 0: each device its own (a GPU)
};

struct Level {
  std::string name;
  int64_t size = 0;      // devices one group of this level joins; 0: any number (outermost)
  double bandwidth = 0;  // bytes/s per device, one direction, as a ring achieves it (bus bw)
  double latency = 0;    // seconds per message step
  // all-reduce's bus bandwidth where it differs (NVLink SHARP reduces in the switch: 480 GB/s on
  // 8 H100 against 370 for all-gather and reduce-scatter); 0: `bandwidth`
  double all_reduce_bandwidth = 0;
  // devices that share one link of this level (a host of two ranks with one NIC: 2; each GPU its
  // own NIC: 1): collectives of one step that cross the level from those devices at once divide
  // the link's `bandwidth` (cost.h: link_load). Consecutive ranks share; it divides the inner
  // level's size.
  int64_t shared_by = 1;
  // A CPU host's collective and compute running at once (the communication thread and the network
  // stack take cores from the kernels): how many times longer each takes while the other runs
  // (>= 1; 1 where communication has engines of its own, as on a GPU). `loom calibrate --level`
  // measures them.
  double comm_beside_compute = 1, compute_beside_comm = 1;
  // How many times longer a collective takes on a rank's communication thread (which waits
  // politely, sleeping between polls: runtime/comm_stream.h) than on its compute thread, alone;
  // `bandwidth` and `latency` are the compute thread's. 1 on a GPU.
  double comm_thread_slowdown = 1;
  // Seconds a collective waits, on average, for the last of its ranks to reach it when the ranks
  // come to it from kernels (they run out of step: the system's noise, shared cores); it adds to
  // every collective of the level. 0 where the ranks keep in step (a GPU's). `loom calibrate
  // --level` measures it after a sublayer's worth of GEMMs.
  double skew = 0;
  // The level's collectives as measured (`loom calibrate --level`: [level.comm], kind -> [ranks,
  // bytes per rank, seconds]), every group of a step's shape running at once: the level's whole
  // groups and, where its inner level's groups hold several devices, groups of one device from
  // each (a hierarchical reduction's step across). A collective of a measured rank count costs
  // its time interpolated in bytes (the links' sharing and the MPI library's algorithm for that
  // group size as measured: Open MPI's all_gather is recursive doubling on 4 ranks and a pairwise
  // exchange on 2); any other, the ring of `bandwidth` and `latency`.
  std::map<ir::Op, std::vector<CommSample>> comm;
};

// Achieved fractions of peak where no profile was measured (docs/simulator.md: the efficiency
// model and its sources).
struct Efficiency {
  double matmul = 0.7;             // of peak FLOP/s, for a large GEMM
  double matmul_half_flops = 2e9;  // the GEMM size (FLOPs) at which half of `matmul` is reached
  double attention = 0.5;          // of peak FLOP/s
  double memory = 0.8;             // of memory bandwidth, for streaming ops
};

struct Cluster {
  std::string source;  // the file, for messages
  std::string name;
  Device device;
  std::vector<Level> levels;  // innermost first
  Efficiency efficiency;
  std::optional<Profile> profile;
  int64_t devices_per_node = 1;
  int64_t devices = 0;  // the default device count of `loom plan` (0: the plan's mesh size)
  double pue = 1.0;
  double carbon_intensity = 0;  // kg CO2e per kWh
};

// The device's peak FLOP/s for dtype t (an op of another dtype, i32: the first the device lists).
double peak_flops(const Cluster& c, DType t);

// Reads and checks a cluster file; throws loom::Error naming the file and the key.
Cluster load_cluster(const std::string& path);
// The same from text (`source` names it in messages).
Cluster parse_cluster(const std::string& text, const std::string& source);
// Writes `c` as a cluster file (`loom calibrate`), atomically.
void write_cluster(const Cluster& c, const std::string& path, const std::string& header);

// Where each mesh axis runs: the levels, innermost first, hold the mesh's axes from the last
// (ranks are row-major: the last axis's ranks are neighbours) outwards; an axis's group spans its
// size times the sizes of the axes inside it, and runs on the innermost level whose size holds that
// span. Throws loom::Error naming the cluster file when the mesh needs more devices than the
// cluster declares, or an axis spans more devices than its outermost level joins.
struct Placement {
  std::map<std::string, int> level;  // axis -> index into Cluster::levels
};
Placement place(const shard::Mesh& mesh, const Cluster& c, int64_t devices);
// The level a collective over `group` (an axis, or a sub-group: shard::Mesh::parse_group) runs on:
// an axis's from the placement; a sub-group's, the innermost level that holds the devices each
// part's digit spans (its stride and size times the sizes of the axes inside its axis), outermost
// over the parts.
int group_level(const shard::Mesh& mesh, const Cluster& c, const Placement& p,
                std::string_view group);

}  // namespace loom::sim
