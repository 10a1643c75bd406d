#include "loom/sim/simulate.h"

#include <algorithm>

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
  double now = 0, comm_free = 0;
  std::vector<double> ready(g.values().size(), 0);  // per in-flight value: its collective's end
  for (const ir::Node& n : g.nodes()) {
    if (ops::has_trait(n.op, ops::Trait::collective)) {
      const std::string& axis = n.attr_str("axis");
      const int64_t ranks = mesh.group_size(axis);
      const int level = group_level(mesh, c, p, axis);
      const double in = buffer_bytes(g, n.inputs[0]);
      const double dur = collective_seconds(n.op, in, ranks, c, level);
      ++r.collectives;
      r.comm_seconds += dur;
      AxisTraffic& t = r.axis_traffic[axis];
      t.count++;
      t.bytes += moved_bytes(g, n);
      r.level_bytes[c.levels[size_t(level)].name] += collective_wire_bytes(n.op, in, ranks);
      r.scratch_bytes =
          std::max(r.scratch_bytes,
                   int64_t(collective_scratch_bytes(n.op, in, ranks, o.mpi_ranks && stream)));
      if (!stream) {
        now += dur;
        r.exposed_comm_seconds += dur;
        continue;
      }
      const double end = std::max(now, comm_free) + dur;
      comm_free = end;
      if (n.attr_int("async", 0) == 1) {
        ready[size_t(n.outputs[0])] = end;
      } else {
        r.exposed_comm_seconds += end - now;
        now = end;
      }
      continue;
    }
    if (ops::has_trait(n.op, ops::Trait::completion)) {
      const double end = ready[size_t(n.inputs[0])];
      if (end > now) r.exposed_comm_seconds += end - now, now = end;
      continue;
    }
    const ops::OpDef& def = ops::op_def(n.op);
    const ops::Cost cost = def.cost ? def.cost(g, n) : ops::Cost{};
    const double s = node_seconds(g, n, cost, c) * o.oversubscription;
    r.flops += cost.flops;
    r.compute_seconds += s;
    r.compute_by_op[n.op] += s;
    now += s;
  }
  r.step_seconds = std::max(now, comm_free);
  if (!o.memory) return r;
  const runtime::MemoryPlan mp = runtime::plan_memory(g);
  r.planned_bytes = mp.arena_bytes + mp.external_bytes;
  const bool processes = o.mpi_ranks && mesh.size() > 1;
  r.peak_bytes = r.planned_bytes + r.scratch_bytes +
                 int64_t(processes ? c.device.rank_runtime_bytes : c.device.runtime_bytes);
  return r;
}

}  // namespace loom::sim
