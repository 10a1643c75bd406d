// Executor: runs a Graph on one rank's device (device.h), node by node in order, with every
// node-produced tensor at its planned offset in one arena (memory_plan.h) of that device's memory.
// External values (params, states, inputs) are bound by the caller and must stay valid while the
// executor runs.
//
// A per-rank program's collectives (shard/lower.h) run on the communicators given by set_comms():
// on the calling thread, in program order, or, when the program has asynchronous collectives
// (passes/prefetch.cc: a collective with async = 1 and its wait), every collective on a
// CommStream (comm_stream.h): the host's for a group within one host, the network's for one that
// spans hosts (Communicator::spans_hosts), the compute thread blocking only at waits (and at once
// after a synchronous one). Each stream runs its collectives in program order, so every
// communicator sees the same order on every rank; the two streams run side by side (a
// tensor-parallel gather on NVLink beside FSDP's reduce-scatter over the network, as NCCL's
// communicators run on their own streams), while collectives that share the host's links, or the
// network's, take turns, as they would share the links' bandwidth anyway (on a CPU host, two
// threads over shared memory only take cores from compute). Where the communicators cannot run
// two groups at once (MPI below MPI_THREAD_MULTIPLE: Communicator::concurrent_groups) one stream
// runs all. run() returns with nothing in flight.
//
// On a device that records (a GPU), the second run() records the program as one graph and every
// later run replays it (the first runs it node by node: its libraries choose their algorithms
// then). Not for a program with collectives, nor while profiling or tracing; bind() drops the
// recording.
//
// Not here: multi-device; compute runs on the calling thread with OpenMP inside the kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/runtime/device.h"
#include "loom/runtime/memory_plan.h"

namespace loom::runtime {

class MeshComms;
class CommStream;
class Trace;

struct NodeTiming {
  double seconds = 0;
  int64_t calls = 0;
  // the largest temporary one of its calls took beside the arena (Device::take_scratch_high)
  int64_t scratch_bytes = 0;
};

class Executor {
 public:
  // Runs g on `device` (its kernels, its memory). Throws loom::Error naming the op when the device
  // has no kernel for one of g's nodes, or when the arena cannot be allocated.
  explicit Executor(const ir::Graph& g, Device& device = cpu_device());
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const ir::Graph& graph() const { return g_; }
  const MemoryPlan& plan() const { return plan_; }

  // Binds an external value (param, state, input) to caller memory of value_bytes() bytes.
  void bind(int value, void* data);
  // Runs every node, or the program's first `nodes` (a micro-batch before a step's last:
  // passes/micro_batch.cc). Throws loom::Error if an external value is unbound or a kernel rejects
  // its input (e.g. a token id outside the vocabulary).
  void run();
  void run(size_t nodes);
  // Any value's memory (arena values are valid until the next run()).
  void* data(int value) const;
  template <class T>
  T* ptr(int value) const {
    return static_cast<T*>(data(value));
  }

  // The communicators a sharded program's collectives run on (kept by the caller).
  void set_comms(const MeshComms* comms) { comms_ = comms; }

  // Per-node time, summed over runs, when profiling is on: the interval between the device's time
  // stamps (Device::stamps) before and after each node, the kernels queued back to back (on a GPU,
  // not recorded as a graph); and the largest scratch each node's kernels took beside the arena.
  void set_profiling(bool on) {
    profile_ = on;
    recordings_.clear();
  }
  // Records every node of the following runs into `trace` (kept by the caller; null stops).
  void set_trace(Trace* trace) {
    trace_ = trace;
    recordings_.clear();
  }
  // Whether the last run() replayed a recording of the program (a CUDA graph).
  bool replayed() const { return replayed_; }
  // Communication as the compute thread saw it, summed over runs: collectives launched, and the
  // seconds it spent blocked on them (at waits, and in synchronous collectives): the exposed
  // communication. Always counted (two clock reads per collective).
  struct CommStats {
    int64_t collectives = 0;
    double exposed_seconds = 0;
    CommStats& operator+=(const CommStats& o) {
      collectives += o.collectives;
      exposed_seconds += o.exposed_seconds;
      return *this;
    }
  };
  const CommStats& comm_stats() const { return comm_stats_; }
  std::vector<std::pair<std::string, NodeTiming>> op_times() const;
  const std::vector<NodeTiming>& node_times() const { return node_times_; }

 private:
  const ir::Graph& g_;
  Device& device_;
  MemoryPlan plan_;
  char* arena_ = nullptr;
  std::vector<void*> external_;
  bool profile_ = false;
  std::vector<NodeTiming> node_times_;
  std::unique_ptr<Stamps> stamps_;      // a profiled run's, made on its first
  std::vector<const Kernel*> kernels_;  // per node, looked up once; null for a collective
  const MeshComms* comms_ = nullptr;
  bool async_ = false;  // the program has an asynchronous collective: all of them on streams
  std::map<bool, std::unique_ptr<CommStream>> streams_;  // the host's (false), the network's
  std::vector<std::pair<CommStream*, int64_t>> ticket_;  // per in-flight value: stream, ticket
  std::vector<bool> completes_;  // per node: a wait (ops::Trait::completion)
  Trace* trace_ = nullptr;
  CommStats comm_stats_;
  // The program (or a prefix of it: keyed by its node count) recorded on the device, replayed;
  // and how often each ran unrecorded.
  std::map<size_t, std::unique_ptr<Recording>> recordings_;
  std::map<size_t, int64_t> runs_;
  bool recordable_ = true;  // false once the device declined to record it
  bool replayed_ = false;
  void run_nodes(size_t count);
  CommStream& stream_for(const ir::Node& n);
  void launch(const ir::Node& n, void* const* ins, void* const* outs);
  // Blocks on the stream; returns the microseconds waited, which count as exposed.
  double wait_for(std::pair<CommStream*, int64_t> ticket);
};

}  // namespace loom::runtime
