#include "loom/runtime/executor.h"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/comm_stream.h"
#include "loom/runtime/trace.h"

namespace loom::runtime {

Executor::Executor(const ir::Graph& g, Device& device)
    : g_(g), device_(device), plan_(plan_memory(g)) {
  external_.assign(g.values().size(), nullptr);
  node_times_.resize(g.nodes().size());
  bool async = false;
  for (const ir::Node& n : g.nodes()) {
    kernels_.push_back(runs_on_comms(n.op) ? nullptr : &device.kernels().get(g, n));
    completes_.push_back(ops::has_trait(n.op, ops::Trait::completion));
    async = async || n.attr_int("async", 0) == 1;
  }
  if (async) {
    async_ = true;
    ticket_.assign(g.values().size(), {nullptr, 0});
  }
  if (plan_.arena_bytes > 0) arena_ = static_cast<char*>(device.allocate(plan_.arena_bytes));
}

Executor::~Executor() {
  bool idle = true;
  for (auto& [axis, s] : streams_) idle = idle && s->idle();
  if (!idle) {
    // a collective is still blocked on a failed peer (an error is unwinding this rank): it may
    // still write into the arena, so the streams and it are left to the ending process
    // (comm_stream.h)
    for (auto& [axis, s] : streams_) (void)s.release();
    return;
  }
  if (arena_) device_.release(arena_);
}

void Executor::bind(int value, void* data) {
  LOOM_CHECK(g_.value(value).kind != ir::ValueKind::node) << "bind of a node value";
  if (external_[value] != data) recordings_.clear();  // it read the old address
  external_[value] = data;
}

void* Executor::data(int value) const {
  int r = plan_.root[value];
  if (g_.value(r).kind != ir::ValueKind::node) return external_[r];
  return arena_ + plan_.offset[value];
}

namespace {

int64_t output_bytes(const ir::Graph& g, const ir::Node& n) {
  int64_t b = 0;
  for (int v : n.outputs) b += value_bytes(g.value(v));
  return b;
}

// Whether this rank has its cores to itself: its compute threads no more than the cores it may run
// on (its affinity) and its share of the host's (the host's ranks in `world` share them). Then a
// compute thread blocked at a wait leaves a core idle, and the communication stream may poll flat
// out (CommStream's hurry): megatron on 2 ranks of 2 cores, 3-7% faster; 4 ranks of 1 thread on 2
// cores, where polling takes another rank's core, 3.5-3.9% slower with it (docs/comm.md).
bool cores_to_spare(const comm::Communicator& world) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mine = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  const double share = double(std::max(1u, std::thread::hardware_concurrency())) /
                       double(std::max(1, world.host_ranks()));
  return double(omp_get_max_threads()) <= std::min(double(mine), share);
}

// A collective's comm-lane event, timed around `run`.
template <class F>
void traced(Trace* trace, const ir::Graph& g, const ir::Node& n, F&& run) {
  if (!trace) return run();
  const double t0 = Trace::now_us();
  run();
  trace->add({g.value(n.outputs[0]).name, std::string(ir::op_name(n.op)), TraceEvent::comm, t0,
              Trace::now_us() - t0, output_bytes(g, n)});
}

}  // namespace

CommStream& Executor::stream_for(const ir::Node& n) {
  auto a = n.attrs.find("axis");
  bool network = false;
  if (comms_->world().concurrent_groups() && a != n.attrs.end() &&
      std::holds_alternative<std::string>(a->second))
    network = comms_->axis(std::get<std::string>(a->second)).spans_hosts();
  std::unique_ptr<CommStream>& s = streams_[network];
  if (!s) s = std::make_unique<CommStream>(cores_to_spare(comms_->world()));
  return *s;
}

double Executor::wait_for(std::pair<CommStream*, int64_t> ticket) {
  const double t0 = Trace::now_us();
  LOOM_CHECK(ticket.first) << "executor: a wait for a collective that was not started";
  ticket.first->wait(ticket.second);
  const double us = Trace::now_us() - t0;
  comm_stats_.exposed_seconds += us * 1e-6;
  return us;
}

void Executor::launch(const ir::Node& n, void* const* ins, void* const* outs) {
  if (kernels_[n.id]) {
    (*kernels_[n.id])(g_, n, ins, outs);
    return;
  }
  if (!comms_)
    throw Error(
        fmt::format("executor: %{} = {}(...) needs communicators (a sharded program run "
                    "without its ranks)",
                    g_.value(n.outputs[0]).name, n.op));
  ++comm_stats_.collectives;
  if (!async_) {  // on this thread: all of it exposed
    const double t0 = Trace::now_us();
    traced(trace_, g_, n, [&] { run_collective(g_, n, ins, outs, *comms_); });
    comm_stats_.exposed_seconds += (Trace::now_us() - t0) * 1e-6;
    return;
  }
  // captures nothing of the executor itself: a stream left running by a failing rank outlives it
  const ir::Graph* g = &g_;
  const MeshComms* comms = comms_;
  Trace* trace = trace_;
  std::vector<void*> in(ins, ins + n.inputs.size()), out(outs, outs + n.outputs.size());
  CommStream& stream = stream_for(n);
  const std::pair<CommStream*, int64_t> t = {
      &stream, stream.submit([g, &n, comms, trace, in = std::move(in), out = std::move(out)] {
        traced(trace, *g, n, [&] { run_collective(*g, n, in.data(), out.data(), *comms); });
      })};
  if (n.attr_int("async", 0) == 1) {
    ticket_[size_t(n.outputs[0])] = t;
    return;
  }
  const double us = wait_for(t);
  if (trace_)
    trace_->add({"wait " + g_.value(n.outputs[0]).name, "wait", TraceEvent::compute,
                 Trace::now_us() - us, us, 0});
}

void Executor::run() { run(g_.nodes().size()); }

void Executor::run(size_t nodes) {
  LOOM_CHECK(nodes <= g_.nodes().size()) << "run(" << nodes << ") of " << g_.nodes().size();
  replayed_ = false;
  for (const ir::Value& v : g_.values())
    if (v.kind != ir::ValueKind::node && !external_[v.id] && value_bytes(v) > 0)
      throw Error(fmt::format("executor: graph input %{} ({}) is not bound", v.name,
                              ir::kind_name(v.kind)));
  std::unique_ptr<Recording>& recording = recordings_[nodes];
  if (!recording && recordable_ && runs_[nodes] > 0 && !profile_ && !trace_ && !comms_ && !async_) {
    recording = device_.record([this, nodes] { run_nodes(nodes); });
    recordable_ = recording != nullptr;
  }
  if (recording) {
    replayed_ = true;
    return recording->replay();
  }
  ++runs_[nodes];
  run_nodes(nodes);
}

// A profiled run without a trace stamps the device's queue after each node and reads the stamps
// once the run is queued, so that a GPU's kernels are timed as they run back to back (no
// synchronisation between them; an interval also holds the gap before its kernel started). On the
// CPU a stamp is the host's clock, and a node's interval its kernel, or the wait for its
// collective. A traced run synchronises after each node and times it on the host's clock.
void Executor::run_nodes(size_t count) {
  const bool stamped = profile_ && !trace_;
  if (stamped) {
    if (!stamps_) stamps_ = device_.stamps(g_.nodes().size() + 1);
    stamps_->stamp(0);
  }
  std::vector<void*> ins, outs;
  if (profile_) device_.take_scratch_high();  // what came before is no node's
  for (size_t i = 0; i < count; ++i) {
    const ir::Node& n = g_.nodes()[i];
    ins.clear();
    outs.clear();
    for (int v : n.inputs) ins.push_back(data(v));
    for (int v : n.outputs) outs.push_back(data(v));
    const bool completes = async_ && completes_[size_t(n.id)];
    if (!trace_) {
      if (completes) wait_for(ticket_[size_t(n.inputs[0])]);
      launch(n, ins.data(), outs.data());
      if (stamped) {
        stamps_->stamp(size_t(n.id) + 1);
        NodeTiming& t = node_times_[n.id];
        t.scratch_bytes = std::max(t.scratch_bytes, device_.take_scratch_high());
      }
      continue;
    }
    const double t0 = Trace::now_us();
    if (completes) wait_for(ticket_[size_t(n.inputs[0])]);  // the time spent waiting: exposed
    launch(n, ins.data(), outs.data());
    device_.synchronize();  // a GPU's kernel is only queued: time it to its end
    const double us = Trace::now_us() - t0;
    if (profile_) {
      NodeTiming& t = node_times_[n.id];
      t.seconds += us * 1e-6;
      t.calls++;
      t.scratch_bytes = std::max(t.scratch_bytes, device_.take_scratch_high());
    }
    if (kernels_[n.id])  // a collective traced itself, on the comm lane
      trace_->add({(completes ? "wait " : "") + g_.value(n.outputs[0]).name,
                   std::string(ir::op_name(n.op)), TraceEvent::compute, t0, us,
                   output_bytes(g_, n)});
  }
  for (auto& [axis, s] : streams_) s->drain();
  if (!stamped) return;
  const std::vector<double> t = stamps_->seconds();
  for (size_t i = 0; i < count && i + 1 < t.size(); ++i) {
    node_times_[i].seconds += t[i + 1] - t[i];
    node_times_[i].calls++;
  }
}

std::vector<std::pair<std::string, NodeTiming>> Executor::op_times() const {
  std::map<std::string, NodeTiming> by_op;
  for (const ir::Node& n : g_.nodes()) {
    auto& t = by_op[std::string(ir::op_name(n.op))];
    t.seconds += node_times_[n.id].seconds;
    t.calls += node_times_[n.id].calls;
  }
  return {by_op.begin(), by_op.end()};
}

}  // namespace loom::runtime
