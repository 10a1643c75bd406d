// bucket (stage scheduled): fewer, larger collectives. Under [passes] bucket = "block", the
// all-gathers of parameters and the reductions (reduce_scatter, all_reduce) of gradients that a
// run of one parameter group (roles.blocks: a transformer block, the embedding, the head) issues
// in a row become one collective over a packed buffer, up to bucket_mb each: SimpleFSDP's manual
// bucketing. "In a row" is per kind (op, axis, dim, n): the forward's all-gathers of block k form
// one bucket and the backward's re-gathers of block k another (a value gathered again starts a new
// bucket), the gradient reductions of block k a third.
//
//   all_gather, members x_i (s_i, ...) split on dim 0:
//     concat(reshape(x_i, (1, |x_i|))) -> (1, S) -> all_gather dim 0 -> (n, S)
//     -> split (n, |x_i|) -> reshape (n s_i, ...)              each rank's block of x_i is one row
//   reduce_scatter, members g_i (n s_i, ...) on dim 0:
//     concat(reshape(g_i, (n, |g_i|/n))) -> (n, S) -> reduce_scatter dim 0 -> (1, S)
//     -> split (1, |g_i|/n) -> reshape (s_i, ...)
//   all_reduce: as reduce_scatter with the rows (1, |g_i|), the whole sum kept
// Each member's old output name goes to its reshape, so the rest of the program reads as before.
//
// Where: an all-gather bucket at its first member (every member's input is a parameter, there
// from the start), a reduction bucket at its last member (the last gradient is done there). The
// other nodes keep their order but wait for their inputs: a consumer of an early member's output
// moves after the bucket (list scheduling in program order).
//
// A parameter gathered in bf16 (passes/gather_cast.cc: its all-gather reads cast(parameter)) is a
// member too, of a bf16 bucket: the casts move to the bucket and pack into it.
//
// Not bucketed: collectives of other values (Megatron's activations, sequence parallelism), dims
// other than 0, dtypes other than f32 and bf16, and runs of one.
//
// bucket = "auto" (SimpleFSDP's automatic bucketing, decided by cost rather than by a greedy
// rule): the candidates are the block buckets and buckets of several consecutive groups up to a
// byte target (1 MB, 2 MB, ... up to bucket_mb); each candidate program is scheduled as prefetch
// will schedule it and simulated on [passes] cluster (sim/: the op costs, the link's bandwidth and
// latency, the two streams), and the fastest is kept: on a slow link, one group per bucket so the
// next one starts early; where each collective's latency is what shows, several.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"
#include "loom/sim/simulate.h"

namespace loom::passes {

namespace {

struct Bucket {
  std::vector<int> members;  // old node ids, in program order
  int anchor = -1;           // the old node it is emitted in place of
  int64_t bytes = 0;
  int block = -1;
};

// The cast node an all-gather's input comes from when it gathers cast(parameter) (gather_cast.cc);
// -1 otherwise.
int cast_of_param(const ir::Graph& g, const ir::Node& n) {
  const ir::Value& in = g.value(n.inputs[0]);
  if (n.op != ir::Op::all_gather || in.kind != ir::ValueKind::node) return -1;
  const ir::Node& p = g.node(in.producer);
  if (p.op != ir::Op::cast || g.value(p.inputs[0]).kind == ir::ValueKind::node) return -1;
  return p.id;
}

// The value an all-gather gathers, seen through a cast of it: the parameter.
int gathered_source(const ir::Graph& g, const ir::Node& n) {
  const int c = cast_of_param(g, n);
  return c >= 0 ? g.node(c).inputs[0] : n.inputs[0];
}

// Which parameter group a bucketable collective belongs to; nullopt: not bucketable. param_group
// holds each parameter's group, and under gradient accumulation each gradient sum's (its
// parameter's).
std::optional<int> group_of(const ir::Graph& g, const ir::Node& n,
                            const std::vector<int>& param_group, const Uses& uses) {
  if (n.op != ir::Op::all_gather && n.op != ir::Op::reduce_scatter && n.op != ir::Op::all_reduce)
    return {};
  if (n.op != ir::Op::all_reduce && n.attr_int("dim") != 0) return {};
  const DType t = g.value(n.inputs[0]).type.dtype;
  if (t != DType::f32 && t != DType::bf16) return {};
  if (n.op == ir::Op::all_gather) {  // a parameter's block, or its cast
    const int p = gathered_source(g, n);
    if (g.value(p).kind == ir::ValueKind::node || param_group[size_t(p)] < 0) return {};
    return param_group[size_t(p)];
  }
  // a gradient (f32, or bf16 under [passes] reduce_dtype): its reduced value is an optimizer's
  // gradient input, or added into its parameter's gradient sum
  const int owner = reduced_gradient_owner(g, n, uses);
  if (owner < 0 || param_group[size_t(owner)] < 0) return {};
  return param_group[size_t(owner)];
}

// Emits bucket b's pack, collective and unpack, and maps each member's output to its unpacked
// value.
void emit_bucket(Rewriter& rw, const Bucket& b, const std::string& group) {
  const ir::Graph& g = rw.old_graph();
  ops::Builder& bld = rw.builder();
  const ir::Node& first = g.node(b.members[0]);
  const ir::Op op = first.op;
  // rows of the packed buffer: the all-gather's input is one row per rank's block; a
  // reduce-scatter's input has one row per destination rank; an all-reduce's one row
  const int64_t rows = op == ir::Op::reduce_scatter ? first.attr_int("n") : 1;
  std::vector<int> parts;
  std::vector<int64_t> widths;
  for (int m : b.members) {
    const int in = rw.map(g.node(m).inputs[0]);
    const int64_t w = numel(g.value(g.node(m).inputs[0]).type.shape) / rows;
    widths.push_back(w);
    parts.push_back(bld.reshape(in, {rows, w}, g.value(g.node(m).outputs[0]).name + ".row"));
  }
  const std::string base = fmt::format("bucket.{}.{}", group, op);
  const int packed = bld.emit1(ir::Op::concat, parts, {}, base + ".in");
  const int moved = bld.emit1(op, {packed}, first.attrs, base);
  std::vector<std::string> names;
  for (int m : b.members) names.push_back(g.value(g.node(m).outputs[0]).name + ".part");
  auto pieces = bld.emit(ir::Op::split, {moved}, {{"sizes", widths}}, names);
  for (size_t i = 0; i < b.members.size(); ++i) {
    const ir::Value& out = g.value(g.node(b.members[i]).outputs[0]);
    rw.alias(out.id, bld.reshape(pieces[i], out.type.shape, out.name));
  }
}

// Every bucketable collective of the program, in program order, with its parameter group and
// its kind (op, axis, dim, ranks: what may share a buffer).
struct Member {
  int node = -1, group = -1;
  int64_t bytes = 0;
  std::string kind;
};

std::vector<Member> bucketable(const Compilation& c) {
  const ir::Graph& g = c.rank.graph;
  std::vector<int> param_group = param_groups(c);
  if (c.accumulation)
    for (auto [p, sum] : c.accumulation->sums) {
      const int lp = c.rank.local[size_t(p)], ls = c.rank.local[size_t(sum)];
      if (lp >= 0 && ls >= 0) param_group[size_t(ls)] = param_group[size_t(lp)];
    }
  const Uses uses = uses_of(g);
  std::vector<Member> out;
  for (const ir::Node& n : g.nodes()) {
    const auto grp = group_of(g, n, param_group, uses);
    if (!grp) continue;
    const ir::TensorType& t = g.value(n.inputs[0]).type;
    out.push_back({n.id, *grp, numel(t.shape) * int64_t(dtype_size(t.dtype)),
                   fmt::format("{} {} {} {} {}", n.op, n.attr_str("axis"), n.attr_int("dim", -1),
                               n.attr_int("n", -1), dtype_name(t.dtype))});
  }
  return out;
}

// Runs of members per kind, in program order, closed where `ends(bucket, next member)` says, where
// the cap would be passed, or where a value already in the bucket comes again (the backward's
// re-gather of a parameter the forward gathered).
std::vector<Bucket> runs(const ir::Graph& g, const std::vector<Member>& members, int64_t cap,
                         const std::function<bool(const Bucket&, const Member&)>& ends) {
  std::map<std::string, Bucket> open;
  std::vector<Bucket> buckets;
  auto close = [&](Bucket& b) {
    if (b.members.size() > 1) buckets.push_back(b);
    b = Bucket{};
  };
  for (const Member& m : members) {
    Bucket& b = open[m.kind];
    const int in = gathered_source(g, g.node(m.node));
    const bool again = std::any_of(b.members.begin(), b.members.end(),
                                   [&](int x) { return gathered_source(g, g.node(x)) == in; });
    if (!b.members.empty() && (ends(b, m) || b.bytes + m.bytes > cap || again)) close(b);
    if (b.members.empty()) b.block = m.group;
    b.members.push_back(m.node);
    b.bytes += m.bytes;
  }
  for (auto& [kind, b] : open) close(b);
  return buckets;
}

// The program with `buckets` merged (each named after its first member's group).
shard::Program merged(const Compilation& c, std::vector<Bucket> buckets) {
  const ir::Graph& g = c.rank.graph;
  const auto& blocks = c.model.roles.blocks;
  std::map<int, int> bucket_of;  // old member node -> bucket index
  std::set<int> moved;           // members' casts of parameters: emitted with their bucket
  for (size_t i = 0; i < buckets.size(); ++i) {
    Bucket& b = buckets[i];
    b.anchor = g.node(b.members[0]).op == ir::Op::all_gather ? b.members.front() : b.members.back();
    for (int m : b.members) {
      bucket_of[m] = int(i);
      if (const int c = cast_of_param(g, g.node(m)); c >= 0) moved.insert(c);
    }
  }
  // List scheduling in program order: an item (a node, or a bucket at its anchor) is emitted once
  // its inputs exist; what cannot be yet waits, in order, and is retried after each emission.
  // Point-to-point ops (a pipeline stage's send and recv) keep their order: a recv that needs no
  // input must not pass a send waiting for a bucket, whose message the peer may need first.
  Rewriter rw(c.rank);
  auto ready = [&](int item) {
    auto it = bucket_of.find(item);
    if (it == bucket_of.end()) return rw.ready(g.node(item));
    for (int m : buckets[size_t(it->second)].members) {
      const int c = cast_of_param(g, g.node(m));
      if (!rw.ready(g.node(c >= 0 ? c : m))) return false;
    }
    return true;
  };
  auto emit = [&](int item) {
    auto it = bucket_of.find(item);
    if (it == bucket_of.end()) {
      rw.copy(g.node(item));
      return;
    }
    const Bucket& b = buckets[size_t(it->second)];
    for (int m : b.members)
      if (const int c = cast_of_param(g, g.node(m)); c >= 0) rw.copy(g.node(c));
    emit_bucket(rw, b, blocks[size_t(b.block)].name);
  };
  std::vector<int> waiting;
  for (const ir::Node& n : g.nodes()) {
    if (moved.count(n.id)) continue;
    auto it = bucket_of.find(n.id);
    if (it != bucket_of.end() && buckets[size_t(it->second)].anchor != n.id) continue;
    waiting.push_back(n.id);
    for (bool progress = true; progress;) {
      progress = false;
      bool p2p_waits = false;  // an earlier send or recv is still waiting
      for (size_t i = 0; i < waiting.size(); ++i) {
        const bool p2p =
            !bucket_of.count(waiting[i]) && ops::has_trait(g.node(waiting[i]).op, ops::Trait::p2p);
        if (p2p && p2p_waits) continue;
        if (ready(waiting[i])) {
          emit(waiting[i]);
          waiting.erase(waiting.begin() + long(i));
          progress = true;
          break;
        }
        p2p_waits = p2p_waits || p2p;
      }
    }
  }
  LOOM_CHECK(waiting.empty()) << "bucket: " << waiting.size() << " nodes never became ready";
  return rw.finish();
}

// bucket = "auto": the bucketing whose schedule the simulator predicts fastest on the cluster.
// Candidates: one bucket per parameter group (block), and buckets of whole consecutive groups that
// close at a group boundary once they hold a byte target (1 MB to bucket_mb, doubling); each is
// scheduled as the passes after this one will (prefetch) and simulated (sim/simulate.h) on
// [passes] cluster with the plan's axes placed on its levels. Ties keep the earlier candidate
// (block first, then the smaller target); a candidate equal to an earlier one is not simulated
// again. Returns the winner's program. Buckets finer than a group are not candidates: on this
// machine they measured slower than block (each collective costs the communication thread CPU
// time the shared cores give up, which the simulator does not charge; docs/benchmarks.md).
shard::Program choose(const Compilation& c, const Options& o, const std::vector<Member>& members,
                      int64_t cap) {
  const ir::Graph& g = c.rank.graph;
  if (!o.schedule.cluster)
    throw Error("[passes] bucket = \"auto\" needs a cluster file ([passes] cluster)");
  const sim::Cluster& cl = *o.schedule.cluster;
  const sim::Placement pl = sim::place(o.plan.mesh, cl, 0);
  std::vector<std::vector<Bucket>> candidates{
      runs(g, members, cap, [](const Bucket& b, const Member& m) { return b.block != m.group; })};
  for (int64_t target = 1000000; target < cap * 2; target *= 2) {
    const int64_t t = std::min(target, cap);
    candidates.push_back(runs(g, members, cap, [t](const Bucket& b, const Member& m) {
      return b.block != m.group && b.bytes >= t;
    }));
    if (t == cap) break;
  }
  auto members_of = [](const std::vector<Bucket>& bs) {
    std::vector<std::vector<int>> m;
    for (const Bucket& b : bs) m.push_back(b.members);
    return m;
  };
  std::set<std::vector<std::vector<int>>> seen;
  shard::Program best;
  double best_s = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!seen.insert(members_of(candidates[i])).second) continue;
    Compilation t;
    t.model.roles = c.model.roles;  // prefetch chains parameter gathers by group (param_groups)
    t.rank = merged(c, candidates[i]);
    const shard::Program unscheduled = t.rank;
    prefetch_pass().run(t, o);
    // a pipeline stage's messages count as there when it asks: its merges compared alone
    const double s =
        sim::simulate(t.rank.graph, o.plan.mesh, cl, pl, {.memory = false, .messages_ready = true})
            .step_seconds;
    if (i == 0 || s < best_s) best = unscheduled, best_s = s;
  }
  return best;
}

void run_bucket(Compilation& c, const Options& o) {
  using B = ScheduleOptions::Bucket;
  if (o.schedule.bucket == B::none) return;
  const std::vector<Member> members = bucketable(c);
  if (members.size() < 2) return;  // nothing to merge (one process has no collectives)
  const int64_t cap = int64_t(o.schedule.bucket_mb * 1e6);
  if (o.schedule.bucket == B::automatic) {
    c.rank = choose(c, o, members, cap);
    return;
  }
  std::vector<Bucket> buckets =
      runs(c.rank.graph, members, cap,
           [](const Bucket& b, const Member& m) { return b.block != m.group; });
  if (buckets.empty()) return;
  c.rank = merged(c, std::move(buckets));
}

}  // namespace

Pass bucket_pass() {
  return {"bucket",
          "merge a parameter group's all-gathers and gradient reductions into one collective "
          "([passes] bucket)",
          Stage::scheduled, run_bucket};
}

}  // namespace loom::passes
