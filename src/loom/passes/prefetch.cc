// prefetch (stage scheduled): communication under computation. Under [passes] prefetch = true every
// collective of the per-rank program becomes a start (the collective with async = 1, its output in
// flight) and a wait (ops/collective.cc), and the program is re-emitted so that starts come early
// and waits late; the executor runs the starts on the rank's communication thread
// (runtime/comm_stream.h) and blocks only at waits.
//
// The order (list scheduling over the old program):
//   - every other node keeps its place in program order ("the skeleton");
//   - a wait, and the reshapes and splits that only unpack its output (a bucket's), are emitted
//     when the first skeleton node needs them: as late as possible;
//   - a start, and the reshapes, concats and casts that only pack its input, are emitted as soon as
//     its input exists, with two limits. Parameter all-gathers (their input is a parameter, or a
//     cast of one: gather_cast.cc) form a chain, in runs of one parameter group (roles.blocks;
//     under bf16 a block gathers a bf16 bucket and an f32 one): a run starts when the first wait
//     of the run before it is emitted, so while block k computes, block k+1's parameters arrive
//     (FSDP's prefetch of the next module; in the backward, the next re-gather). And at most
//     max_in_flight units of one mesh axis are in flight (a hierarchical reduction's pieces count
//     as their axis's), so a tensor-parallel gather never waits for the gradient reduce-scatters
//     of the data axis ahead of it. A unit is FSDP's: one parameter group's gathers count as one
//     however many buckets they take, and so do the reductions of one group's gradients; any
//     other collective counts alone. A start of a unit already in flight takes no room; any other
//     start beyond the limit first emits its axis's oldest one's wait, except where that is a
//     start of the same run of the chain: the run's next start then waits for room (a run never
//     blocks the compute thread on its own first gathers before the block they serve computes).
//     Counted by bucket instead, a 405B layer's 64 MB buckets let two of its dozen gathers, or of
//     its gradients' reduce-scatters, run under the compute before the compute thread waited. The
//     first starts come before the program's first node: a pipeline stage's is the recv it idles
//     in until its peer sends, while its gathers run.
// Worked example (fsdp, two blocks, bucketed): start(gather l0), start(gather l1) at the top;
// wait(l0) before l0's first matmul; l0 computes while l1's gather runs; wait(l1) before l1's ...;
// in the backward, the reduce-scatter of l1's gradients starts as soon as they exist and runs
// under l0's backward, and waits where the gradient norm reads it.
//
// The verifier checks the result: nothing reads an in-flight value but its wait, nothing
// overwrites a collective's input before its wait, and every value is made before it is used.
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"
#include "loom/shard/sharding.h"

namespace loom::passes {

namespace {

enum class Kind { node, start, wait };

// A start's wait is the item right after it.
struct Item {
  Kind kind;
  int node;               // the old node
  std::vector<int> deps;  // the items it reads from (a wait: its start)
  bool lazy = false;      // emitted on demand (waits and their unpacking)
  bool eager = false;     // emitted as early as allowed (starts and their packing)
  bool chain = false;     // a start of a parameter all-gather (the prefetch chain)
  // a start: what it counts as in flight (`unit` below): 2 g for group g's parameter gathers,
  // 2 g + 1 for the reductions of group g's gradients, -1: itself alone
  int unit = -1;
  bool done = false;
};

bool is_collective(const ir::Node& n) { return ops::has_trait(n.op, ops::Trait::collective); }

// the axis whose in-flight collectives a collective counts among (shard::Mesh::axes_of)
std::string axis_of(const ir::Node& n) { return shard::Mesh::axes_of(n.attr_str("axis")); }

class Scheduler {
 public:
  Scheduler(const shard::Program& prog, int64_t max_in_flight, std::vector<int> param_group)
      : g_(prog.graph),
        rw_(prog),
        max_(max_in_flight),
        param_group_(std::move(param_group)),
        uses_(uses_of(prog.graph)) {}

  shard::Program run() {
    build_items();
    classify();
    index_blockers();
    try_starts();  // before the first node: a pipeline stage's is a recv, waiting for its peer
    for (size_t i = 0; i < items_.size(); ++i) {
      if (items_[i].lazy || items_[i].eager) continue;
      emit(int(i));
      try_starts();
    }
    try_starts();
    for (size_t i = 0; i < items_.size(); ++i) emit(int(i));  // what nothing demanded
    return rw_.finish();
  }

 private:
  const ir::Graph& g_;
  Rewriter rw_;
  int64_t max_;
  std::vector<Item> items_;
  std::map<int, int> inflight_value_;  // started old collective node -> its in-flight new value
  // per mesh axis (shard::Mesh::axes_of): started, not waited (their start items)
  std::map<std::string, std::deque<int>> inflight_;
  std::vector<int> starts_;             // start items, in order
  std::vector<std::vector<int>> runs_;  // the chain: its runs in order, each its start items
  size_t next_run_ = 0;                 // the runs before it are all started
  std::vector<int> param_group_;        // old value -> its parameter group, or -1
  Uses uses_;                           // of the old program
  // A start outside the chain is ready once the items it waits on are done: those its inputs
  // come from through packing alone (ready() below). Per such start, how many are not done yet;
  // per item, the starts it holds back; the starts not emitted with none left, in order. (Asking
  // ready() of every start after every node made the pass quadratic in the program's length.)
  std::vector<int> blockers_;
  std::vector<std::vector<int>> holds_;
  std::set<int> ready_;

  void build_items() {
    std::vector<int> item_of_value(g_.values().size(), -1);  // old value -> the item making it
    for (const ir::Node& n : g_.nodes()) {
      const bool collective = is_collective(n);
      Item it{collective ? Kind::start : Kind::node, n.id};
      for (int v : n.inputs)  // graph inputs have no item
        if (item_of_value[size_t(v)] >= 0) it.deps.push_back(item_of_value[size_t(v)]);
      items_.push_back(std::move(it));
      if (collective) {
        starts_.push_back(int(items_.size()) - 1);
        items_.push_back({Kind::wait, n.id, {int(items_.size()) - 1}});
      }
      for (int v : n.outputs) item_of_value[size_t(v)] = int(items_.size()) - 1;
    }
  }

  static bool unpacks(ir::Op op) { return op == ir::Op::reshape || op == ir::Op::split; }
  static bool packs(ir::Op op) {
    return op == ir::Op::reshape || op == ir::Op::concat ||
           op == ir::Op::cast;  // cast: gather_cast.cc's blocks
  }

  void classify() {
    std::map<int, std::vector<int>> users;  // item -> items that read it
    for (size_t i = 0; i < items_.size(); ++i)
      for (int d : items_[i].deps) users[d].push_back(int(i));
    for (size_t i = 0; i < items_.size(); ++i) {  // forward: waits and what only unpacks them
      Item& it = items_[i];
      if (it.kind == Kind::wait) it.lazy = true;
      if (it.kind != Kind::node || !unpacks(g_.node(it.node).op)) continue;
      const auto& d = it.deps;
      it.lazy = !d.empty() &&
                std::all_of(d.begin(), d.end(), [&](int x) { return items_[size_t(x)].lazy; });
    }
    for (size_t k = items_.size(); k-- > 0;) {  // backward: starts and what only packs for them
      Item& it = items_[k];
      if (it.kind == Kind::start) it.eager = true;
      if (it.kind != Kind::node || !packs(g_.node(it.node).op) || it.lazy) continue;
      const auto& u = users[int(k)];
      it.eager = !u.empty() &&
                 std::all_of(u.begin(), u.end(), [&](int x) { return items_[size_t(x)].eager; });
    }
    int run_group = -1;
    std::set<int> run_params;
    for (int s : starts_) {
      Item& it = items_[size_t(s)];
      const int reduced = reduction_group(g_.node(it.node));
      if (reduced >= 0) it.unit = 2 * reduced + 1;
      if (g_.node(it.node).op != ir::Op::all_gather) continue;
      it.chain = only_params(s);
      if (!it.chain) continue;
      // a new run at another group, or at a parameter the run already gathers (the backward's
      // re-gather of the group the forward ended with)
      std::set<int> params;
      const int grp = group_read(it.node, params);
      if (grp >= 0) it.unit = 2 * grp;
      const bool again =
          std::any_of(params.begin(), params.end(), [&](int p) { return run_params.count(p) > 0; });
      if (runs_.empty() || grp < 0 || grp != run_group || again) {
        runs_.emplace_back();
        run_group = grp;
        run_params.clear();
      }
      run_params.insert(params.begin(), params.end());
      runs_.back().push_back(s);
    }
  }

  // The graph inputs old node n reads (into `params`), through the nodes that make its inputs (a
  // bucket's reshapes, concat and casts); returns the parameter group of the first with one, or -1.
  int group_read(int node, std::set<int>& params) const {
    int grp = -1;
    for (int v : g_.node(node).inputs) {
      const ir::Value& val = g_.value(v);
      const int gv = val.kind == ir::ValueKind::node ? group_read(val.producer, params)
                                                     : param_group_[size_t(v)];
      if (val.kind != ir::ValueKind::node) params.insert(v);
      if (grp < 0) grp = gv;
    }
    return grp;
  }

  // The parameter group whose gradients collective n reduces: followed from its output through
  // what unpacks it (a bucket's split and reshapes, reduce_cast's cast back to f32) to the
  // optimizers that read the pieces as gradients; -1 for any other collective (and a gradient
  // sum's reduction under accumulation, which counts alone).
  int reduction_group(const ir::Node& n) const {
    if (n.op != ir::Op::reduce_scatter && n.op != ir::Op::all_reduce) return -1;
    std::vector<int> todo{n.outputs[0]};
    while (!todo.empty()) {
      const int v = todo.back();
      todo.pop_back();
      auto u = uses_.find(v);
      if (u == uses_.end()) continue;
      for (auto [node, slot] : u->second) {
        const ir::Node& c = g_.node(node);
        if (slot == 1 && ops::has_trait(c.op, ops::Trait::optimizer)) {
          if (param_group_[size_t(c.inputs[0])] >= 0) return param_group_[size_t(c.inputs[0])];
        } else if (unpacks(c.op) || c.op == ir::Op::cast) {
          todo.insert(todo.end(), c.outputs.begin(), c.outputs.end());
        }
      }
    }
    return -1;
  }

  // What one axis has in flight, in units: a parameter group's gathers count as one, and so do
  // the reductions of its gradients (FSDP's unit is the group, however many buckets it takes);
  // every other collective counts alone.
  int64_t units(const std::deque<int>& axis) const {
    std::set<int> seen;
    int64_t n = 0;
    for (int s : axis) {
      const int u = items_[size_t(s)].unit;
      if (u < 0 || seen.insert(u).second) ++n;
    }
    return n;
  }
  // Whether start s's unit is in flight on the axis already (then s takes no more room).
  bool joins(const std::deque<int>& axis, int s) const {
    const int u = items_[size_t(s)].unit;
    return u >= 0 && std::any_of(axis.begin(), axis.end(),
                                 [&](int x) { return items_[size_t(x)].unit == u; });
  }

  void index_blockers() {
    blockers_.assign(items_.size(), 0);
    holds_.assign(items_.size(), {});
    for (int s : starts_) {
      if (items_[size_t(s)].chain) continue;
      std::set<int> seen;
      std::vector<int> todo = items_[size_t(s)].deps;
      while (!todo.empty()) {
        const int d = todo.back();
        todo.pop_back();
        if (!seen.insert(d).second) continue;
        const Item& di = items_[size_t(d)];
        if (di.eager) {
          todo.insert(todo.end(), di.deps.begin(), di.deps.end());
        } else {
          ++blockers_[size_t(s)];
          holds_[size_t(d)].push_back(s);
        }
      }
      if (blockers_[size_t(s)] == 0) ready_.insert(s);
    }
  }

  // Item i is done: the starts it held back may be ready; a start emitted is ready no more.
  void mark_done(int i) {
    items_[size_t(i)].done = true;
    ready_.erase(i);
    for (int s : holds_[size_t(i)])
      if (--blockers_[size_t(s)] == 0 && !items_[size_t(s)].done) ready_.insert(s);
  }

  // Whether an item's inputs come from graph inputs through packing alone.
  bool only_params(int item) const {
    for (int d : items_[size_t(item)].deps)
      if (!items_[size_t(d)].eager || !only_params(d)) return false;
    return true;
  }

  // Whether an item can be emitted now without emitting a skeleton node or forcing a wait.
  bool ready(int item) const {
    for (int d : items_[size_t(item)].deps) {
      const Item& di = items_[size_t(d)];
      if (di.done) continue;
      if (!di.eager || !ready(d)) return false;
    }
    return true;
  }

  // Whether chain start s may be emitted now: its group's gathers are in flight already, its axis
  // has fewer than max_in_flight units in flight, or the oldest (whose wait it would force) is
  // not of s's own run: a run never waits for its own first gathers before the compute they serve.
  bool room(int s) const {
    auto it = inflight_.find(axis_of(g_.node(items_[size_t(s)].node)));
    if (it == inflight_.end() || joins(it->second, s) || units(it->second) < max_) return true;
    const auto& run = runs_[next_run_];
    return std::find(run.begin(), run.end(), it->second.front()) == run.end();
  }

  // Whether run r of the chain may start: the first, or one whose previous run has a wait emitted.
  bool run_may_start(size_t r) const {
    if (r == 0) return true;
    for (int s : runs_[r - 1])
      if (items_[size_t(s + 1)].done) return true;  // its wait
    return false;
  }

  void try_starts() {
    for (bool progress = true; progress;) {
      progress = false;
      // the prefetch chain, one run ahead: its first start not emitted yet (a wait demanded
      // early emits its start out of turn), once its run may start
      auto started = [&](int s) { return items_[size_t(s)].done; };
      while (next_run_ < runs_.size() &&
             std::all_of(runs_[next_run_].begin(), runs_[next_run_].end(), started))
        ++next_run_;
      // a start of the chain waits for room on its axis rather than forcing a wait of its run
      if (next_run_ < runs_.size() && run_may_start(next_run_))
        for (int s : runs_[next_run_]) {
          if (started(s)) continue;
          if (ready(s) && room(s)) emit(s), progress = true;
          break;
        }
      // every other start, as soon as it can: in order, each that is ready when reached
      for (int pos = -1;;) {
        const auto it = ready_.upper_bound(pos);
        if (it == ready_.end()) break;
        pos = *it;
        emit(pos);
        progress = true;
      }
    }
  }

  void emit(int item) {
    Item& it = items_[size_t(item)];
    if (it.done) return;
    for (int d : it.deps) emit(d);
    if (it.done) return;  // a dependency's forced wait can emit it
    const ir::Node& n = g_.node(it.node);
    ops::Builder& b = rw_.builder();
    if (it.kind == Kind::node) {
      rw_.copy(n);
    } else if (it.kind == Kind::start) {
      std::deque<int>& axis = inflight_[axis_of(n)];
      if (!joins(axis, item))
        while (units(axis) >= max_) emit(axis.front() + 1);  // its wait
      ir::Attrs a = n.attrs;
      a["async"] = int64_t(1);
      inflight_value_[n.id] =
          b.emit1(n.op, {rw_.map(n.inputs[0])}, a, g_.value(n.outputs[0]).name + ".inflight");
      inflight_[axis_of(n)].push_back(item);
    } else {
      const int out = b.emit1(ir::Op::wait, {inflight_value_.at(n.id), rw_.map(n.inputs[0])}, {},
                              g_.value(n.outputs[0]).name);
      rw_.alias(n.outputs[0], out);
      std::erase(inflight_[axis_of(n)], item - 1);
    }
    mark_done(item);
  }
};

void run_prefetch(Compilation& c, const Options& o) {
  if (!o.schedule.prefetch) return;
  bool any = false;
  for (const ir::Node& n : c.rank.graph.nodes()) any = any || is_collective(n);
  if (!any) return;
  c.rank = Scheduler(c.rank, o.schedule.max_in_flight, param_groups(c)).run();
}

}  // namespace

Pass prefetch_pass() {
  return {"prefetch",
          "start collectives early and wait for them late, on the communication thread "
          "([passes] prefetch, max_in_flight)",
          Stage::scheduled, run_prefetch};
}

}  // namespace loom::passes
