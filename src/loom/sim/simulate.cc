#include "loom/sim/simulate.h"

#include <algorithm>
#include <deque>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/runtime/memory_plan.h"
#include "loom/sim/cost.h"

namespace loom::sim {

namespace {

double buffer_bytes(const ir::Graph& g, int v) { return double(runtime::value_bytes(g.value(v))); }

// The bytes a collective counts as moved: an all_gather's whole output, another's whole input.
double moved_bytes(const ir::Graph& g, const ir::Node& n) {
  return buffer_bytes(g, n.op == ir::Op::all_gather ? n.outputs[0] : n.inputs[0]);
}

}  // namespace

std::map<std::string, std::map<std::string, AxisTraffic>> traffic(const ir::Graph& g) {
  std::map<std::string, std::map<std::string, AxisTraffic>> moved;
  for (const ir::Node& n : g.nodes()) {
    if (!ops::has_trait(n.op, ops::Trait::collective)) continue;  // shard_slice moves nothing
    AxisTraffic& e = moved[n.attr_str("axis")][std::string(ir::op_name(n.op))];
    e.count++;
    e.bytes += moved_bytes(g, n);
  }
  return moved;
}

Prediction simulate(const ir::Graph& g, const shard::Mesh& mesh, const Cluster& c,
                    const Placement& p, const SimOptions& o) {
  Prediction r;
  bool stream = false;
  for (const ir::Node& n : g.nodes()) stream = stream || n.attr_int("async", 0) == 1;
  // The communication stream: collectives in issue order, the front one in progress at `now`.
  // While it runs beside compute, both go at the rates of the front's level
  // (Level::comm_beside_compute, compute_beside_comm).
  struct InFlight {
    double work;  // seconds left at full speed
    int value;    // its output, whose completion the compute stream may wait for
    const Level* level;
  };
  std::deque<InFlight> queue;
  double now = 0;
  std::vector<char> done(g.values().size(), 1);  // per collective output: finished
  auto finish_front = [&] {
    done[size_t(queue.front().value)] = 1;
    queue.pop_front();
  };
  // the compute stream runs `work` seconds (at full speed) of a kernel
  auto compute = [&](double work) {
    while (work > 0) {
      if (queue.empty()) {
        now += work;
        r.compute_seconds += work;
        return;
      }
      InFlight& f = queue.front();
      const double slow_comm = f.level->comm_beside_compute;
      const double slow_compute = f.level->compute_beside_comm;
      const double t_compute = work * slow_compute, t_comm = f.work * slow_comm;
      if (t_compute < t_comm) {
        now += t_compute;
        r.compute_seconds += t_compute;
        f.work -= t_compute / slow_comm;
        return;
      }
      now += t_comm;
      r.compute_seconds += t_comm;
      work -= t_comm / slow_compute;
      finish_front();
    }
  };
  // the compute stream waits for collective output v (the stream runs alone meanwhile)
  auto wait = [&](int v) {
    const double from = now;
    while (!done[size_t(v)]) {
      now += queue.front().work;
      finish_front();
    }
    r.exposed_comm_seconds += now - from;
  };
  std::map<std::pair<std::string, bool>, double> loads;  // (group, all_to_all) -> link load
  const size_t count = o.nodes < 0 ? g.nodes().size() : size_t(o.nodes);
  LOOM_CHECK(count <= g.nodes().size());
  for (size_t i = 0; i < count; ++i) {
    const ir::Node& n = g.nodes()[i];
    if (ops::has_trait(n.op, ops::Trait::collective)) {
      const std::string& axis = n.attr_str("axis");
      const int64_t ranks = mesh.group_size(axis);
      const int level = group_level(mesh, c, p, axis);
      const double in = buffer_bytes(g, n.inputs[0]);
      const bool pairs = n.op == ir::Op::all_to_all;
      auto [at, fresh] = loads.try_emplace({axis, pairs}, 1.0);
      if (fresh) at->second = link_load(n.op, mesh, c, level, axis);
      const Level& lv = c.levels[size_t(level)];
      // on the communication thread, if the program has one, at its (polite) pace
      const double dur = collective_seconds(n.op, in, ranks, c, level, at->second) *
                         (stream ? lv.comm_thread_slowdown : 1);
      ++r.collectives;
      r.comm_seconds += dur;
      AxisTraffic& t = r.axis_traffic[axis];
      t.count++;
      t.bytes += moved_bytes(g, n);
      r.level_bytes[c.levels[size_t(level)].name] += collective_wire_bytes(n.op, in, ranks);
      r.scratch_bytes =
          std::max(r.scratch_bytes,
                   int64_t(collective_scratch_bytes(n.op, in, ranks, o.mpi_ranks && stream)));
      if (!stream) {  // on the compute stream
        now += dur;
        r.exposed_comm_seconds += dur;
        continue;
      }
      const int v = n.outputs[0];
      done[size_t(v)] = 0;
      queue.push_back({dur, v, &lv});
      if (n.attr_int("async", 0) != 1) wait(v);
      continue;
    }
    if (ops::has_trait(n.op, ops::Trait::completion)) {
      wait(n.inputs[0]);
      continue;
    }
    const ops::OpDef& def = ops::op_def(n.op);
    const ops::Cost cost = def.cost ? def.cost(g, n) : ops::Cost{};
    const double s = node_seconds(g, n, cost, c) * o.oversubscription;
    if (o.memory)
      r.scratch_bytes = std::max(r.scratch_bytes, int64_t(node_scratch_bytes(g, n, cost, c)));
    r.flops += cost.flops;
    const double before = r.compute_seconds;
    compute(s);
    r.compute_by_op[n.op] += r.compute_seconds - before;
  }
  while (!queue.empty()) {  // what is still in flight at the step's end
    now += queue.front().work;
    finish_front();
  }
  r.step_seconds = now;
  if (!o.memory) return r;
  const runtime::MemoryPlan mp = runtime::plan_memory(g);
  r.planned_bytes = mp.arena_bytes + mp.external_bytes;
  const bool processes = o.mpi_ranks && mesh.size() > 1;
  r.peak_bytes = r.planned_bytes + r.scratch_bytes +
                 int64_t(processes ? c.device.rank_runtime_bytes : c.device.runtime_bytes);
  return r;
}

}  // namespace loom::sim
