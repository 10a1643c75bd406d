#include "loom/passes/verify.h"

#include <fmt/format.h>

#include "loom/ops/verify.h"

namespace loom::passes {

namespace {

void check_sharding(const ir::Value& v, const shard::Sharding& s, const Options& opts,
                    std::vector<std::string>& out) {
  const size_t before = out.size();
  for (const auto& dim : s.dims)
    for (const auto& axis : dim)
      if (!opts.plan.mesh.has(axis))
        out.push_back(fmt::format("%{}: split over axis '{}', which the mesh {} lacks", v.name,
                                  axis, opts.plan.mesh.to_string()));
  if (s.dims.size() != v.type.shape.size())
    out.push_back(fmt::format("%{} ({}): sharding {} has {} dims", v.name, ir::type_str(v.type),
                              shard::to_string(s), s.dims.size()));
  if (out.size() > before) return;
  if (auto e = shard::check_sharding(v.type.shape, s, opts.plan.mesh); !e.empty())
    out.push_back(
        fmt::format("%{} ({}): {}: {}", v.name, ir::type_str(v.type), shard::to_string(s), e));
}

void check_shardings(const Compilation& c, const Options& opts, std::vector<std::string>& out) {
  const ir::Graph& g = c.model.graph;
  for (const auto& [v, a] : c.annotations) {
    if (v < 0 || v >= int(g.values().size())) {
      out.push_back(fmt::format("an annotation names value id {}, not in the graph", v));
      continue;
    }
    check_sharding(g.value(v), a.sharding, opts, out);
  }
  const shard::Propagation& p = c.propagation;
  if (p.value.empty()) return;  // propagation has not run yet
  if (p.value.size() != g.values().size()) {
    out.push_back(fmt::format("{} shardings for {} values", p.value.size(), g.values().size()));
    return;
  }
  for (const ir::Value& v : g.values()) check_sharding(v, p.value[size_t(v.id)], opts, out);
}

void check_rank_program(const Compilation& c, std::vector<std::string>& out) {
  const shard::Program& r = c.rank;
  for (auto& d : ops::verify(r.graph)) out.push_back("rank program: " + d);
  const int n = int(r.graph.values().size());
  const ir::Graph& g = c.model.graph;
  if (r.local.size() != g.values().size())
    out.push_back(
        fmt::format("rank program maps {} of {} global values", r.local.size(), g.values().size()));
  for (const ir::Value& v : g.values())
    if (v.kind != ir::ValueKind::node && v.id < int(r.local.size()) &&
        (r.local[size_t(v.id)] < 0 || r.local[size_t(v.id)] >= n))
      out.push_back(fmt::format("graph input %{} has no value in the rank program", v.name));
  if (r.outputs.size() != g.outputs().size())
    out.push_back(fmt::format("rank program has {} outputs, the global graph {}", r.outputs.size(),
                              g.outputs().size()));
  for (int o : r.outputs)
    if (o < 0 || o >= n) out.push_back(fmt::format("rank program output id {} is no value", o));
}

}  // namespace

std::vector<std::string> verify(const Compilation& c, const Options& opts, Stage stage) {
  std::vector<std::string> out = ops::verify(c.model.graph);
  // the shardings after the passes that make them (apply_tactics, propagate: the sharded stage);
  // later stages' passes read them and leave them as they are (a pipeline's stages, cut from one
  // lowered program, checked every value's sharding again after every pass of every stage)
  if (stage == Stage::sharded) check_shardings(c, opts, out);
  if (stage >= Stage::lowered) check_rank_program(c, out);
  return out;
}

}  // namespace loom::passes
