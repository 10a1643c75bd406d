#include "loom/search/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <variant>

#include "loom/core/error.h"
#include "loom/models/model.h"
#include "loom/ops/linear.h"
#include "loom/ops/op.h"
#include "loom/runtime/memory_plan.h"
#include "loom/sim/cost.h"
#include "loom/sim/kernel_list.h"
#include "loom/sim/simulate.h"
#include "loom/train/compile.h"

namespace loom::search {

namespace {

// A program's compute kernels (sim/kernel_list.h), into `out` keyed by their signature; `count`
// adds up over a step's programs, `steps` of it; `predicted_s` is the cluster's time for one. Only
// the program's first `nodes` nodes when >= 0 (a micro-batch's prefix).
void collect_kernels(const ir::Graph& g, const sim::Cluster& cl, double steps, nlohmann::json& out,
                     int64_t nodes = -1) {
  const size_t count = nodes < 0 ? g.nodes().size() : size_t(nodes);
  for (size_t i = 0; i < count; ++i) {
    const ir::Node& n = g.nodes()[i];
    if (!sim::listed_kernel(n)) continue;
    nlohmann::json k = sim::kernel_json(g, n);
    const std::string sig = sim::kernel_signature(k);
    if (out.contains(sig)) {
      out[sig]["count"] = out[sig]["count"].get<double>() + steps;
      continue;
    }
    const ops::OpDef& def = ops::op_def(n.op);
    k["predicted_s"] = sim::node_seconds(g, n, def.cost ? def.cost(g, n) : ops::Cost{}, cl);
    k["count"] = steps;
    out[sig] = std::move(k);
  }
}

}  // namespace

nlohmann::json predict(const train::Config& cfg, const std::shared_ptr<const sim::Cluster>& cluster,
                       int64_t devices, const std::string& name, nlohmann::json* kernels,
                       const passes::Compilation* trained) {
  const sim::Cluster& cl = *cluster;
  const shard::Plan& plan = cfg.plan.plan;
  const int64_t ranks = plan.empty() ? 1 : plan.mesh.size();
  train::Config c = cfg;
  // bucket = "auto" decides on the cluster the prediction is for
  if (c.passes.bucket == passes::ScheduleOptions::Bucket::automatic || c.passes.synthesize)
    c.passes.cluster = cluster;
  const shard::Tactic* pipe = plan.empty() ? nullptr : shard::find_pipeline(plan);
  // a pipeline: every stage's program, compiled once to the lowered stage
  const std::vector<shard::Program> stages =
      pipe ? train::compile_stages(c, passes::StepKind::train, ranks)
           : std::vector<shard::Program>{};
  train::CompiledStep step;  // without a pipeline: the one program every rank runs
  if (!pipe)
    step = trained ? train::compile_step(c, *trained, plan.empty() ? 0 : ranks)
                   : train::compile_step(c, passes::StepKind::train, !plan.empty(),
                                         plan.empty() ? 0 : ranks);
  // one process runs its one-rank program too
  const ir::Graph& prog = pipe ? stages[0].graph : step.c.rank.graph;
  const int64_t n = devices > 0 ? devices : (cl.devices > 0 ? cl.devices : ranks);
  if (ranks > n)
    throw Error(
        fmt::format("{}: the mesh {} needs {} devices; --devices (or the cluster's "
                    "devices) gives {}",
                    cfg.plan.plan.where, plan.mesh.to_string(), ranks, n));
  // n devices run n / ranks replicas of the plan (data parallel over whole meshes is not
  // simulated: a plan is one mesh, so n must equal the mesh size)
  if (n != ranks)
    throw Error(
        fmt::format("{}: the mesh {} has {} ranks, the cluster {} devices: make the "
                    "mesh's sizes multiply to the device count",
                    cfg.plan.plan.where, plan.mesh.to_string(), ranks, n));
  const sim::Placement pl = plan.empty() ? sim::Placement{} : sim::place(plan.mesh, cl, n);
  sim::SimOptions so;
  if (cl.device.cores > 0 && cl.profile)
    so.oversubscription =
        std::max(1.0, double(ranks * cl.profile->threads) / double(cl.device.cores));
  so.mpi_ranks = !plan.empty() && cfg.plan.ranks == "mpi";
  sim::Prediction p;
  nlohmann::json stage_rows;  // a pipeline's stages, each its own program's prediction
  if (pipe) {
    // the stages side by side; the step ends with the last stage, memory is the fullest stage's
    std::vector<const ir::Graph*> graphs{&prog};
    for (size_t s = 1; s < stages.size(); ++s) graphs.push_back(&stages[s].graph);
    const std::vector<sim::Prediction> each = sim::simulate_pipeline(graphs, plan.mesh, cl, pl, so);
    size_t last = 0;
    for (size_t s = 0; s < each.size(); ++s)
      if (each[s].step_seconds > each[last].step_seconds) last = s;
    p = each[last];
    nlohmann::json st = nlohmann::json::array();
    for (const sim::Prediction& e : each)
      st.push_back({{"step_ms", e.step_seconds * 1e3},
                    {"compute_ms", e.compute_seconds * 1e3},
                    {"exposed_comm_ms", e.exposed_comm_seconds * 1e3}});
    stage_rows = st;
    p.flops = 0;
    for (const sim::Prediction& e : each) {
      p.flops += e.flops / double(each.size());  // a rank's mean
      p.planned_bytes = std::max(p.planned_bytes, e.planned_bytes);
      p.peak_bytes = std::max(p.peak_bytes, e.peak_bytes);
    }
    if (kernels)
      for (const ir::Graph* g : graphs)
        collect_kernels(*g, cl, 1.0 / double(graphs.size()), *kernels);
  } else {
    p = sim::simulate(prog, plan.mesh, cl, pl, so);
    if (kernels) collect_kernels(prog, cl, 1.0, *kernels);
  }
  // gradient accumulation: the program's micro-batch prefix on `accum` - 1 micro-batches, then the
  // whole program once (the same memory)
  if (step.accum > 1) {
    const double runs = double(step.accum - 1);
    sim::SimOptions prefix = so;
    prefix.memory = false;
    prefix.nodes = int64_t(step.micro_nodes());
    const sim::Prediction m = sim::simulate(prog, plan.mesh, cl, pl, prefix);
    if (kernels) collect_kernels(prog, cl, runs, *kernels, prefix.nodes);
    p.step_seconds += m.step_seconds * runs;
    p.compute_seconds += m.compute_seconds * runs;
    p.comm_seconds += m.comm_seconds * runs;
    p.exposed_comm_seconds += m.exposed_comm_seconds * runs;
    for (const auto& [what, t] : m.exposed_by) p.exposed_by[what] += t * runs;
    p.flops += m.flops * runs;
    p.collectives += int64_t(double(m.collectives) * runs);
    for (const auto& [op, t] : m.compute_by_op) p.compute_by_op[op] += t * runs;
    for (const auto& [l, b] : m.level_bytes) p.level_bytes[l] += b * runs;
    for (const auto& [a, t] : m.axis_traffic) {
      p.axis_traffic[a].count += int64_t(double(t.count) * runs);
      p.axis_traffic[a].bytes += t.bytes * runs;
    }
  }
  const double step_s = p.step_seconds, compute_s = p.compute_seconds, flops = p.flops;
  const std::map<ir::Op, double>& by_op = p.compute_by_op;
  const int64_t planned = p.planned_bytes, peak_bytes = p.peak_bytes;

  const int64_t T = cfg.train.seq_len;
  const double tokens = double(cfg.train.batch_size * T * step.accum);
  const double fpt = models::train_flops_per_token(cfg.model, T);
  const double peak = sim::peak_flops(cl, cfg.model.dtype);
  const double busy = step_s > 0 ? compute_s / step_s : 0;
  const double watts =
      cl.device.idle_watts + (cl.device.peak_watts - cl.device.idle_watts) * std::min(1.0, busy);
  const double kwh = double(n) * step_s * watts * cl.pue / 3.6e6;
  nlohmann::json j;
  j["plan"] = name;
  j["cluster"] = cl.name;
  j["devices"] = n;
  j["mesh"] = plan.empty() ? "{}" : plan.mesh.to_string();
  j["step_ms"] = step_s * 1e3;
  j["tokens_per_s"] = tokens / step_s;
  j["tokens_per_s_per_device"] = tokens / step_s / double(n);
  j["mfu"] = fpt * tokens / double(n) / step_s / peak;
  j["hfu"] = flops / step_s / peak;
  j["compute_ms"] = compute_s * 1e3;
  nlohmann::json bo = nlohmann::json::object();
  for (const auto& [op, t] : by_op) bo[std::string(ir::op_name(op))] = t * 1e3;
  j["compute_ms_by_op"] = bo;
  j["exposed_comm_ms"] = p.exposed_comm_seconds * 1e3;
  nlohmann::json eb = nlohmann::json::object();
  for (const auto& [what, t] : p.exposed_by) eb[what] = t * 1e3;
  j["exposed_ms_by"] = eb;
  if (!stage_rows.is_null()) j["stages"] = stage_rows;
  j["collectives_per_step"] = p.collectives;
  j["planned_bytes"] = planned;
  j["peak_bytes"] = peak_bytes;
  j["fits"] = double(peak_bytes) <= cl.device.memory_bytes;
  nlohmann::json lb = nlohmann::json::object();
  for (const auto& [l, b] : p.level_bytes) lb[l] = b;
  j["bytes_per_level"] = lb;
  nlohmann::json ab = nlohmann::json::object();
  for (const auto& [a, t] : p.axis_traffic) ab[a] = t.bytes;
  j["bytes_per_axis"] = ab;
  j["energy_kwh_per_step"] = kwh;
  j["co2_kg_per_step"] = kwh * cl.carbon_intensity;
  j["energy_kwh_per_mtok"] = kwh / tokens * 1e6;
  j["co2_kg_per_mtok"] = kwh * cl.carbon_intensity / tokens * 1e6;
  if (cl.profile) j["profile_threads"] = cl.profile->threads;
  return j;
}

}  // namespace loom::search
