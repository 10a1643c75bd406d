#include "loom/runtime/executor.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/comm_stream.h"

namespace loom::runtime {

Executor::Executor(const ir::Graph& g) : g_(g), plan_(plan_memory(g)) {
  external_.assign(g.values().size(), nullptr);
  node_times_.resize(g.nodes().size());
  bool async = false;
  for (const ir::Node& n : g.nodes()) {
    kernels_.push_back(runs_on_comms(n.op) ? nullptr : &cpu_kernel(n.op));
    completes_.push_back(ops::has_trait(n.op, ops::Trait::completion));
    async = async || n.attr_int("async", 0) == 1;
  }
  if (async) {
    stream_ = std::make_unique<CommStream>();
    ticket_.assign(g.values().size(), 0);
  }
  if (plan_.arena_bytes > 0) {
    arena_ = static_cast<char*>(std::aligned_alloc(64, size_t(plan_.arena_bytes)));
    if (!arena_)
      throw Error(
          fmt::format("cannot allocate the {} MiB activation arena", plan_.arena_bytes >> 20));
  }
}

Executor::~Executor() {
  if (stream_ && !stream_->idle()) {
    // a collective is still blocked on a failed peer (an error is unwinding this rank): it may
    // still write into the arena, so both are left to the ending process (comm_stream.h)
    (void)stream_.release();
    return;
  }
  std::free(arena_);
}

void Executor::bind(int value, void* data) {
  LOOM_CHECK(g_.value(value).kind != ir::ValueKind::node) << "bind of a node value";
  external_[value] = data;
}

void* Executor::data(int value) const {
  int r = plan_.root[value];
  if (g_.value(r).kind != ir::ValueKind::node) return external_[r];
  return arena_ + plan_.offset[value];
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
  if (!stream_) {
    run_collective(g_, n, ins, outs, *comms_);
    return;
  }
  // captures nothing of the executor itself: a stream left running by a failing rank outlives it
  const ir::Graph* g = &g_;
  const MeshComms* comms = comms_;
  std::vector<void*> in(ins, ins + n.inputs.size()), out(outs, outs + n.outputs.size());
  const int64_t t = stream_->submit([g, &n, comms, in = std::move(in), out = std::move(out)] {
    run_collective(*g, n, in.data(), out.data(), *comms);
  });
  if (n.attr_int("async", 0) == 1)
    ticket_[size_t(n.outputs[0])] = t;
  else
    stream_->wait(t);
}

void Executor::run() {
  for (const ir::Value& v : g_.values())
    if (v.kind != ir::ValueKind::node && !external_[v.id] && value_bytes(v) > 0)
      throw Error(fmt::format("executor: graph input %{} ({}) is not bound", v.name,
                              ir::kind_name(v.kind)));
  std::vector<void*> ins, outs;
  for (const ir::Node& n : g_.nodes()) {
    ins.clear();
    outs.clear();
    for (int v : n.inputs) ins.push_back(data(v));
    for (int v : n.outputs) outs.push_back(data(v));
    if (!profile_) {
      if (stream_ && completes_[size_t(n.id)]) stream_->wait(ticket_[size_t(n.inputs[0])]);
      launch(n, ins.data(), outs.data());
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    if (stream_ && completes_[size_t(n.id)])  // the time spent waiting: exposed
      stream_->wait(ticket_[size_t(n.inputs[0])]);
    launch(n, ins.data(), outs.data());
    node_times_[n.id].seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    node_times_[n.id].calls++;
  }
  if (stream_) stream_->drain();
}

std::vector<std::pair<std::string, NodeTiming>> Executor::op_times() const {
  std::map<std::string, NodeTiming> by_op;
  for (const ir::Node& n : g_.nodes()) {
    auto& t = by_op[n.op];
    t.seconds += node_times_[n.id].seconds;
    t.calls += node_times_[n.id].calls;
  }
  return {by_op.begin(), by_op.end()};
}

}  // namespace loom::runtime
