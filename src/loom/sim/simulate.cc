#include "loom/sim/simulate.h"

#include <algorithm>
#include <deque>
#include <limits>

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

namespace {

// One rank's program as an event simulation that can stop at a recv whose message is not sent yet
// (a pipeline's stages run side by side: simulate_pipeline) and go on once it is.
class RankSim {
 public:
  RankSim(const ir::Graph& g, const shard::Mesh& mesh, const Cluster& c, const Placement& p,
          const SimOptions& o)
      : g_(g), mesh_(mesh), c_(c), p_(p), o_(o), done_(g.values().size(), 1) {
    for (const ir::Node& n : g.nodes()) stream_ = stream_ || n.attr_int("async", 0) == 1;
    count_ = o.nodes < 0 ? g.nodes().size() : size_t(o.nodes);
    LOOM_CHECK(count_ <= g.nodes().size());
  }

  size_t next() const { return i_; }

  // Runs nodes until the program's end (true) or a recv whose message `sent` lacks (false).
  // `sent`: (from stage, to stage, tag) -> the message's arrival time; `stage` is this program's.
  bool run(Messages& sent, int64_t stage) {
    for (; i_ < count_; ++i_) {
      const ir::Node& n = g_.nodes()[i_];
      if (ops::has_trait(n.op, ops::Trait::collective)) {
        collective(n);
        continue;
      }
      if (ops::has_trait(n.op, ops::Trait::completion)) {
        wait(n.inputs[0]);
        continue;
      }
      if (n.op == ir::Op::recv) {
        auto it = sent.find({n.attr_int("peer"), stage, n.attr_int("tag")});
        if (it == sent.end() && !o_.messages_ready) return false;
        if (it != sent.end() && it->second > now_) {  // the compute stream waits for the message
          expose(n, it->second - now_);
          drain_until(it->second);
        }
      }
      kernel(n);
      if (n.op == ir::Op::send) {
        const std::string& axis = n.attr_str("axis");
        const Level& lv = c_.levels[size_t(group_level(mesh_, c_, p_, axis))];
        const double bytes = buffer_bytes(g_, n.inputs[0]);
        const double t = lv.latency + (lv.bandwidth > 0 ? bytes / lv.bandwidth : 0);
        sent[{stage, n.attr_int("peer"), n.attr_int("tag")}] = now_ + t;
        r_.comm_seconds += t;
        AxisTraffic& at = r_.axis_traffic[axis];
        at.count++;
        at.bytes += bytes;
        r_.level_bytes[lv.name] += bytes;
      }
    }
    return true;
  }

  Prediction finish() {
    idle_until(std::numeric_limits<double>::infinity(), -1);  // what is in flight at the end
    r_.step_seconds = now_;
    if (!o_.memory) return r_;
    const runtime::MemoryPlan mp = runtime::plan_memory(g_);
    r_.planned_bytes = mp.arena_bytes + mp.external_bytes;
    const bool processes = o_.mpi_ranks && mesh_.size() > 1;
    r_.peak_bytes = r_.planned_bytes + r_.scratch_bytes +
                    int64_t(processes ? c_.device.rank_runtime_bytes : c_.device.runtime_bytes);
    return r_;
  }

 private:
  // The communication streams, as the executor's (runtime/executor.h): the host's, for groups on
  // the cluster's first level (within a node), and the network's, for groups that reach beyond
  // it; each its collectives in issue order, the front one in progress at `now`, the two side by
  // side. While they run beside compute, each front goes at its level's rate beside compute and
  // the compute stream at the slowest of the fronts' levels' (Level::comm_beside_compute,
  // compute_beside_comm).
  struct InFlight {
    double work;  // seconds left at full speed
    int value;    // its output, whose completion the compute stream may wait for
    const Level* level;
  };

  bool busy() const {
    for (const auto& [network, q] : streams_)
      if (!q.empty()) return true;
    return false;
  }

  // every stream's front goes on for `dt` seconds of wall time, at its rate beside compute
  // (`beside`) or alone; a front done (within rounding) finishes and the next one starts
  void advance(double dt, bool beside) {
    for (auto& [network, q] : streams_) {
      if (q.empty()) continue;
      InFlight& f = q.front();
      f.work -= dt / pace(f, beside);
      if (f.work <= 1e-15) {
        done_[size_t(f.value)] = 1;
        q.pop_front();
      }
    }
  }

  // wall seconds per second of a front's work: its level's pace beside compute, or alone
  static double pace(const InFlight& f, bool beside) {
    return beside ? f.level->comm_beside_compute : 1.0;
  }

  // wall seconds until the first front ends (infinity: none in flight)
  double next_end(bool beside) const {
    double t = std::numeric_limits<double>::infinity();
    for (const auto& [network, q] : streams_)
      if (!q.empty()) t = std::min(t, std::max(0.0, q.front().work) * pace(q.front(), beside));
    return t;
  }

  // the compute stream runs `work` seconds (at full speed) of a kernel
  void compute(double work) {
    while (work > 0) {
      if (!busy()) {
        now_ += work;
        r_.compute_seconds += work;
        return;
      }
      double slow_compute = 1;
      for (const auto& [network, q] : streams_)
        if (!q.empty()) slow_compute = std::max(slow_compute, q.front().level->compute_beside_comm);
      const double t_compute = work * slow_compute, t_comm = next_end(true);
      if (t_compute < t_comm) {
        now_ += t_compute;
        r_.compute_seconds += t_compute;
        advance(t_compute, true);
        return;
      }
      now_ += t_comm;
      r_.compute_seconds += t_comm;
      work -= t_comm / slow_compute;
      advance(t_comm, true);
    }
  }

  // the compute stream idles until time `t` or until collective output v is done (v >= 0),
  // whichever comes first; the streams run alone meanwhile
  void idle_until(double t, int v) {
    while (now_ < t && (v < 0 || !done_[size_t(v)])) {
      const double dt = std::min(t - now_, next_end(false));
      if (dt == std::numeric_limits<double>::infinity()) {
        LOOM_CHECK(v < 0) << "simulate: a wait for a collective no stream runs";
        return;
      }
      now_ += dt;
      advance(dt, false);
    }
  }

  // the compute stream waits for collective output v (the streams run alone meanwhile)
  void wait(int v) {
    const double from = now_;
    idle_until(std::numeric_limits<double>::infinity(), v);
    const ir::Value& val = g_.values()[size_t(v)];
    LOOM_CHECK(val.producer >= 0);
    expose(g_.nodes()[size_t(val.producer)], now_ - from);
  }

  // the compute stream waited `s` seconds for node n (a collective or a recv)
  void expose(const ir::Node& n, double s) {
    if (s <= 0) return;
    r_.exposed_comm_seconds += s;
    r_.exposed_by[fmt::format("{} {}", ir::op_name(n.op), n.attr_str("axis"))] += s;
  }

  // the compute stream idles until `t` (a message's arrival); the streams go on
  void drain_until(double t) { idle_until(t, -1); }

  void collective(const ir::Node& n) {
    const std::string& axis = n.attr_str("axis");
    const int64_t ranks = mesh_.group_size(axis);
    const int level = group_level(mesh_, c_, p_, axis);
    const double in = buffer_bytes(g_, n.inputs[0]);
    const bool pairs = n.op == ir::Op::all_to_all;
    auto [at, fresh] = loads_.try_emplace({axis, pairs}, 1.0);
    if (fresh) at->second = link_load(n.op, mesh_, c_, level, axis);
    const Level& lv = c_.levels[size_t(level)];
    // on the communication thread, if the program has one, at its (polite) pace; when the ranks
    // come to it from kernels, the wait for the last of them (the level's skew) adds to it (a
    // collective issued right after another finds the ranks in step)
    const double dur = collective_seconds(n.op, in, ranks, c_, level, at->second) *
                           (stream_ ? lv.comm_thread_slowdown : 1) +
                       (from_kernels_ ? lv.skew : 0);
    from_kernels_ = false;
    ++r_.collectives;
    r_.comm_seconds += dur;
    AxisTraffic& t = r_.axis_traffic[axis];
    t.count++;
    t.bytes += moved_bytes(g_, n);
    r_.level_bytes[c_.levels[size_t(level)].name] += collective_wire_bytes(n.op, in, ranks);
    r_.scratch_bytes =
        std::max(r_.scratch_bytes,
                 int64_t(collective_scratch_bytes(n.op, in, ranks, o_.mpi_ranks && stream_)));
    if (!stream_) {  // on the compute stream
      now_ += dur;
      expose(n, dur);
      return;
    }
    const int v = n.outputs[0];
    done_[size_t(v)] = 0;
    streams_[level > 0].push_back({dur, v, &lv});
    if (n.attr_int("async", 0) != 1) wait(v);
  }

  void kernel(const ir::Node& n) {
    const ops::OpDef& def = ops::op_def(n.op);
    const ops::Cost cost = def.cost ? def.cost(g_, n) : ops::Cost{};
    const double s = node_seconds(g_, n, cost, c_) * o_.oversubscription;
    if (o_.memory)
      r_.scratch_bytes = std::max(r_.scratch_bytes, int64_t(node_scratch_bytes(g_, n, cost, c_)));
    r_.flops += cost.flops;
    const double before = r_.compute_seconds;
    compute(s);
    from_kernels_ = from_kernels_ || s > 0;
    r_.compute_by_op[n.op] += r_.compute_seconds - before;
  }

  const ir::Graph& g_;
  const shard::Mesh& mesh_;
  const Cluster& c_;
  const Placement& p_;
  const SimOptions& o_;
  Prediction r_;
  bool stream_ = false;
  bool from_kernels_ = true;  // a kernel ran since the last collective was issued
  std::map<bool, std::deque<InFlight>> streams_;  // the host's (false), the network's (true)
  double now_ = 0;
  std::vector<char> done_;                                // per collective output: finished
  std::map<std::pair<std::string, bool>, double> loads_;  // (group, all_to_all) -> link load
  size_t i_ = 0, count_ = 0;
};

}  // namespace

Prediction simulate(const ir::Graph& g, const shard::Mesh& mesh, const Cluster& c,
                    const Placement& p, const SimOptions& o) {
  RankSim sim(g, mesh, c, p, o);
  Messages none;
  if (!sim.run(none, 0))
    throw Error("simulate: the program receives from a pipeline stage: use simulate_pipeline");
  return sim.finish();
}

std::vector<Prediction> simulate_pipeline(const std::vector<const ir::Graph*>& stages,
                                          const shard::Mesh& mesh, const Cluster& c,
                                          const Placement& p, const SimOptions& o) {
  std::vector<RankSim> sims;
  for (const ir::Graph* g : stages) sims.emplace_back(*g, mesh, c, p, o);
  Messages sent;
  std::vector<bool> finished(stages.size(), false);
  for (size_t left = stages.size(); left > 0;) {
    bool moved = false;
    for (size_t s = 0; s < sims.size(); ++s) {
      if (finished[s]) continue;
      const size_t at = sims[s].next();
      if (sims[s].run(sent, int64_t(s))) {
        finished[s] = true;
        --left;
        moved = true;
      }
      moved = moved || sims[s].next() != at;
    }
    LOOM_CHECK(moved || left == 0) << "simulate_pipeline: every unfinished stage waits for a "
                                      "message no stage sends";
  }
  std::vector<Prediction> r;
  for (RankSim& s : sims) r.push_back(s.finish());
  return r;
}

}  // namespace loom::sim
