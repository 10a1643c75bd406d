// synthesize (stage scheduled, after bucket, before prefetch): P²'s hierarchical reductions. Under
// [passes] synthesize = true, each all_reduce of the program (a chain of them, one per axis, when a
// value is a partial sum over several axes) is replaced by the fastest program of sub-group
// collectives sim::p2 synthesizes for its axes' placement on [passes] cluster, where that beats
// the flat all_reduce. The buffer is flattened, reduced by the program's steps over sub-groups
// (shard::Mesh::parse_group: "data[1:2]", the ranks of one node), and reshaped back:
//
//   %g.all_reduce = all_reduce(%g) {axis = "data"}                   data = 4, two per node
// becomes
//   %g.flat = reshape(%g) {shape = [N]}
//   %g.rs = reduce_scatter(%g.flat) {axis = "data[1:2]", dim = 0, n = 2}    in the node
//   %g.ar = all_reduce(%g.rs) {axis = "data[2:2]"}                          across nodes, N/2
//   %g.ag = all_gather(%g.ar) {axis = "data[1:2]", dim = 0, n = 2}          in the node
//   %g.all_reduce = reshape(%g.ag) {shape = ...}
//
// Only all_reduce, reduce_scatter and all_gather steps (the runtime has no reduce or broadcast),
// and only programs whose scatters divide the buffer. Every synthesized program passed the
// symbolic check (sim/p2.h), and the sum is the flat all_reduce's up to the order of float
// additions (tests/plan_parity_test.cc: Synthesize.*).
#include "loom/passes/synthesize.h"

#include <fmt/format.h>

#include <map>

#include "loom/core/error.h"
#include "loom/core/shape.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"
#include "loom/sim/p2.h"

namespace loom::passes {

namespace {

struct Plan2 {
  std::vector<sim::p2::Factor> factors;
  sim::p2::Program program;
};

// The best program for reducing a buffer of `numel` elements of `bytes` over `axes`, or nothing
// where the flat all_reduce is as fast.
std::optional<Plan2> best_program(const shard::Mesh& mesh, const sim::Cluster& cl,
                                  const std::vector<std::string>& axes, int64_t numel,
                                  double bytes) {
  Plan2 p;
  p.factors = sim::p2::reduction_factors(mesh, cl, axes);
  if (p.factors.size() < 2 || p.factors.size() > 6) return std::nullopt;
  const uint32_t all = (1u << p.factors.size()) - 1;
  const double flat = sim::p2::flat_seconds(p.factors, all, bytes, cl);
  for (const sim::p2::Program& prog :
       sim::p2::synthesize(p.factors, all, bytes, cl, 5, /*rooted=*/false)) {
    if (prog.seconds >= flat * (1 - 1e-9)) break;  // sorted: nothing faster follows
    if (!sim::p2::splits_evenly(prog, p.factors, numel)) continue;
    p.program = prog;
    return p;
  }
  return std::nullopt;
}

}  // namespace

std::vector<Reduction> reductions(const ir::Graph& g, const shard::Mesh& mesh) {
  std::vector<int> readers(g.values().size(), 0);
  for (const ir::Node& n : g.nodes())
    for (int v : n.inputs) ++readers[size_t(v)];
  for (int v : g.outputs()) ++readers[size_t(v)];
  // chains: an all_reduce whose input is an all_reduce read by it alone continues that chain
  std::vector<std::vector<int>> chain(g.nodes().size());
  std::vector<bool> inner(g.nodes().size(), false);  // a node folded into a later one
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::all_reduce || !mesh.has(n.attr_str("axis"))) continue;
    chain[size_t(n.id)] = {n.id};
    const int p = g.value(n.inputs[0]).producer;
    if (p >= 0 && g.node(p).op == ir::Op::all_reduce && readers[size_t(n.inputs[0])] == 1 &&
        mesh.has(g.node(p).attr_str("axis"))) {
      chain[size_t(n.id)] = chain[size_t(p)];
      chain[size_t(n.id)].push_back(n.id);
      inner[size_t(p)] = true;
    }
  }
  std::vector<Reduction> out;
  for (const ir::Node& n : g.nodes()) {
    if (chain[size_t(n.id)].empty() || inner[size_t(n.id)]) continue;
    Reduction r;
    r.nodes = chain[size_t(n.id)];
    for (int x : r.nodes) r.axes.push_back(g.node(x).attr_str("axis"));
    const ir::TensorType& t = g.value(g.node(r.nodes.front()).inputs[0]).type;
    r.numel = loom::numel(t.shape);
    r.bytes = double(r.numel * int64_t(dtype_size(t.dtype)));
    out.push_back(std::move(r));
  }
  return out;
}

int emit_program(ops::Builder& b, int x, const shard::Mesh& mesh,
                 const std::vector<sim::p2::Factor>& f, const sim::p2::Program& p,
                 const std::string& name) {
  for (const sim::p2::Step& s : p.steps) {
    const std::string group = sim::p2::group_spec(mesh, f, s.group);
    const int64_t k = mesh.group_size(group);
    switch (s.op) {
      case sim::p2::Coll::all_reduce:
        x = b.emit1(ir::Op::all_reduce, {x}, {{"axis", group}}, name + ".ar");
        break;
      case sim::p2::Coll::reduce_scatter:
        x = b.emit1(ir::Op::reduce_scatter, {x}, {{"axis", group}, {"dim", int64_t(0)}, {"n", k}},
                    name + ".rs");
        break;
      case sim::p2::Coll::all_gather:
        x = b.emit1(ir::Op::all_gather, {x}, {{"axis", group}, {"dim", int64_t(0)}, {"n", k}},
                    name + ".ag");
        break;
      default:
        throw Error(fmt::format("%{}: a {} step, which the runtime has no op for", name,
                                sim::p2::coll_name(s.op)));
    }
  }
  return x;
}

namespace {

void run_synthesize(Compilation& c, const Options& o) {
  if (!o.schedule.synthesize || o.plan.empty()) return;
  if (!o.schedule.cluster)
    throw Error(fmt::format("{}: [passes] synthesize needs [passes] cluster", o.source));
  const sim::Cluster& cl = *o.schedule.cluster;
  const shard::Mesh& mesh = o.plan.mesh;
  const ir::Graph& g = c.rank.graph;
  std::map<int, Plan2> plans;  // last node of a chain -> its program
  std::map<int, std::vector<int>> chain;
  for (const Reduction& r : reductions(g, mesh))
    if (auto p = best_program(mesh, cl, r.axes, r.numel, r.bytes)) {
      plans[r.nodes.back()] = std::move(*p);
      chain[r.nodes.back()] = r.nodes;
    }
  if (plans.empty()) return;
  std::vector<bool> replaced_inner(g.nodes().size(), false);
  for (const auto& [last, p] : plans)
    for (int x : chain[last])
      if (x != last) replaced_inner[size_t(x)] = true;
  Rewriter rw(c.rank);
  ops::Builder& b = rw.builder();
  for (const ir::Node& n : g.nodes()) {
    if (replaced_inner[size_t(n.id)]) continue;
    auto it = plans.find(n.id);
    if (it == plans.end()) {
      rw.copy(n);
      continue;
    }
    const Plan2& p = it->second;
    const int first = chain[n.id].front();
    const int in = g.node(first).inputs[0];
    const ir::TensorType& t = g.value(in).type;
    const std::string& name = g.value(n.outputs[0]).name;
    const int x = b.emit1(ir::Op::reshape, {rw.map(in)},
                          {{"shape", std::vector<int64_t>{numel(t.shape)}}}, name + ".flat");
    const int y = emit_program(b, x, mesh, p.factors, p.program, name);
    rw.alias(n.outputs[0], b.emit1(ir::Op::reshape, {y}, {{"shape", t.shape}}, name));
  }
  c.rank = rw.finish();
}

}  // namespace

Pass synthesize_pass() {
  return {"synthesize",
          "P2: each all_reduce as the fastest program of sub-group collectives on [passes] "
          "cluster ([passes] synthesize)",
          Stage::scheduled, run_synthesize};
}

}  // namespace loom::passes
