// pipeline_stages (stage scheduled, after reshard and recompute): the lowered program, every
// chunk's work for every micro-batch (pipeline_micro_batches), becomes the program of this rank's
// stage (Options::pipe_coord) in the schedule's order. Stage s of p runs the model chunks s, s + p,
// ... (one chunk per stage but under the interleaved schedule).
//
// Where a node runs (its chunk):
//   - a node that reads a parameter, in the parameter's chunk (Pipelining::param_chunk): the
//     forward's matmuls, their VJPs, AdamW and its write-backs;
//   - a backward node (autodiff's), where the forward node it differentiates runs;
//   - any other node, in the latest chunk among its operands' producers; a node made from graph
//     inputs alone (positions, token ids' blocks) runs on every stage that reads it.
// A lowered node runs where the global node it lowers runs (Program::origin: a node recompute
// made again counts as its backward reader's); the outputs' final reductions, and a gather
// reshard made for one reader, where their operands are. A forward node whose parameter's chunk is
// earlier than its operands' (a weight two chunks read: GPT-2's tied embedding) is refused.
//
// A value one stage makes and another reads goes by `send` right after it is made and is
// received (`recv`) where the reader first needs it; the step's outputs (loss, gradient norm) are
// received by every stage. Sends are buffered (comm/communicator.h), so no order of sends and
// receives that the data allows can deadlock. Each (producer stage, reader stage) pair numbers its
// messages in value order: every rank computes the same tags from the same lowered program.
//
// Order: each node has a micro-batch (the latest of its operands'; a batch input of micro-batch k
// has k; a value made without the batch, none) and a phase (forward, backward, the rest: clipping
// and AdamW). The stage emits its items, (phase, micro-batch, chunk), in the schedule's order,
//   gpipe        F0 F1 ... F(m-1) B0 B1 ... B(m-1)
//   1f1b         w = min(p-1-s, m) warm-up forwards F0 .. F(w-1) on stage s of p, then F(w+i)
//                B(i) for each i, then the last w backwards (PipeDream-Flush, Megatron-LM's 1F1B)
//   interleaved  the m v forwards of stage s's v chunks: micro-batches in groups of p, each group
//                through the chunks in order (the k-th forward: micro-batch (k / pv) p + k % p,
//                the stage's chunk (k % pv) / p), the backwards the same with the chunks
//                reversed; w = min(2 (p-1-s) + (v-1) p, m v) warm-up forwards, then one forward
//                and one backward, then the last w backwards (Megatron-LM's interleaved 1F1B,
//                Narayanan et al. 2021); m a multiple of p
// then everything else in program order. An item's nodes go in program order; a node without a
// micro-batch (a weight's gather or cast) goes right before its first reader, and a received value
// right before its first reader. The memory plan then sees the schedule's live activations: 1F1B
// holds at most p - s micro-batches' where GPipe holds all m.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/passes/pipeline.h"
#include "loom/passes/rewrite.h"

namespace loom::passes {

namespace {

enum class Phase { forward, backward, rest };

using Item = std::tuple<Phase, int64_t, int64_t>;  // phase, micro-batch, chunk

std::vector<Item> schedule(const Pipelining& pl, int64_t s, bool backward) {
  const int64_t m = pl.microbatches, p = pl.stages, v = pl.virtual_stages, total = m * v;
  // the stage's k-th forward or backward (v = 1: micro-batch k, chunk s)
  auto item = [&](Phase phase, int64_t k) {
    int64_t local = (k % (p * v)) / p;
    if (phase == Phase::backward) local = v - 1 - local;
    return Item{phase, (k / (p * v)) * p + k % p, local * p + s};
  };
  const int64_t warm = !backward || pl.schedule == "gpipe" ? total
                       : v == 1                            ? std::min(p - 1 - s, m)
                                : std::min(2 * (p - 1 - s) + (v - 1) * p, total);
  std::vector<Item> items;
  for (int64_t k = 0; k < warm; ++k) items.push_back(item(Phase::forward, k));
  if (!backward) return items;
  for (int64_t i = 0; i + warm < total; ++i) {
    items.push_back(item(Phase::forward, warm + i));
    items.push_back(item(Phase::backward, i));
  }
  for (int64_t k = total - warm; k < total; ++k) items.push_back(item(Phase::backward, k));
  return items;
}

// Each global node's chunk (the rules above).
std::vector<int64_t> global_chunks(const Compilation& c, const Options& o) {
  const Pipelining& pl = *c.pipelining;
  const ir::Graph& g = c.model.graph;
  std::vector<int64_t> node(g.nodes().size(), -1), value(g.values().size(), -1);
  const int64_t backward_end = std::max(pl.backward_nodes, pl.forward_nodes);
  for (const ir::Node& n : g.nodes()) {
    int64_t from_params = -1, from_operands = -1;
    int param = -1;
    for (int in : n.inputs) {
      auto it = pl.param_chunk.find(in);
      if (it == pl.param_chunk.end()) {
        from_operands = std::max(from_operands, value[size_t(in)]);
        continue;
      }
      if (from_params >= 0 && it->second != from_params)
        throw Error(fmt::format("{}: pipeline: %{} reads %{} (chunk {}) and %{} (chunk {})",
                                o.source, g.value(n.outputs[0]).name, g.value(param).name,
                                from_params, g.value(in).name, it->second));
      from_params = it->second, param = in;
    }
    int64_t st = from_operands;
    if (from_params >= 0) {
      if (n.id < pl.forward_nodes && from_operands > from_params)
        throw Error(
            fmt::format("{}: pipeline: %{} reads the weight %{} of chunk {} with an operand made "
                        "in chunk {}: a weight two chunks read (a tied embedding and head) is not "
                        "supported by the pipeline tactic yet",
                        o.source, g.value(n.outputs[0]).name, g.value(param).name, from_params,
                        from_operands),
            "untie the embedding (tie_word_embeddings = false), or drop the pipeline");
      st = from_params;
    } else if (n.id >= pl.forward_nodes && n.id < backward_end && pl.origin.size() > size_t(n.id) &&
               pl.origin[size_t(n.id)] >= 0) {
      st = node[size_t(pl.origin[size_t(n.id)])];
    }
    node[size_t(n.id)] = st;
    for (int out : n.outputs) value[size_t(out)] = st;
  }
  return node;
}

class StageCutter {
 public:
  StageCutter(Compilation& c, const Options& o)
      : c_(c), pl_(*c.pipelining), s_(o.pipe_coord), old_(c.rank), g_(old_.graph) {}

  void run(const Options& o) {
    classify(global_chunks(c_, o));
    number_messages();
    Rewriter rw(old_);
    rw_ = &rw;
    emitted_.assign(g_.nodes().size(), false);
    bool backward = false;
    std::map<Item, std::vector<int>> nodes;  // this stage's nodes per item, in program order
    for (const ir::Node& n : g_.nodes()) {
      const size_t i = size_t(n.id);
      backward = backward || phase_[i] == Phase::backward;
      if (stage(n.id) == s_) nodes[{phase_[i], mb_[i], chunk_[i]}].push_back(n.id);
    }
    for (const Item& it : schedule(pl_, s_, backward))
      for (int n : nodes[it]) emit(n);
    for (const ir::Node& n : g_.nodes())
      if (stage(n.id) == s_) emit(n.id);
    for (int v : old_.outputs) ensure(v);
    // the global values this stage never makes or receives are not in its program
    for (int& v : old_.local)
      if (v >= 0 && rw.map(v) < 0) v = -1;
    c_.rank = rw.finish();
  }

 private:
  // A rank node's stage; the chunk and stage of the node that makes a value (-1: an input).
  int64_t stage(int node) const { return pl_.stage_of_chunk(chunk_[size_t(node)]); }
  int64_t vchunk(int v) const {
    const ir::Value& val = g_.value(v);
    return val.kind == ir::ValueKind::node ? chunk_[size_t(val.producer)] : -1;
  }
  int64_t vstage(int v) const { return pl_.stage_of_chunk(vchunk(v)); }

  // Each rank node's chunk, phase and micro-batch.
  void classify(const std::vector<int64_t>& global) {
    const size_t n = g_.nodes().size();
    chunk_.assign(n, -1);
    mb_.assign(n, -1);
    phase_.assign(n, Phase::rest);
    std::vector<int64_t> vmb(g_.values().size(), -1);
    for (size_t k = 0; k < pl_.inputs.size(); ++k)
      for (int v : pl_.inputs[k])
        if (old_.local[size_t(v)] >= 0) vmb[size_t(old_.local[size_t(v)])] = int64_t(k);
    const int64_t backward_end = std::max(pl_.backward_nodes, pl_.forward_nodes);
    for (const ir::Node& node : g_.nodes()) {
      const size_t i = size_t(node.id);
      const int gn = i < old_.origin.size() ? old_.origin[i] : -1;
      int64_t ch = -1, mb = -1;
      for (int in : node.inputs) {
        ch = std::max(ch, vchunk(in));
        mb = std::max(mb, vmb[size_t(in)]);
      }
      if (gn >= 0) {
        ch = global[size_t(gn)];
        phase_[i] = gn < pl_.forward_nodes ? Phase::forward
                    : gn < backward_end    ? Phase::backward
                                           : Phase::rest;
      }
      chunk_[i] = ch;
      mb_[i] = mb;
      for (int out : node.outputs) vmb[size_t(out)] = mb;
    }
  }

  // Which stages read each value made on another, and each message's tag.
  void number_messages() {
    readers_.assign(g_.values().size(), {});
    for (const ir::Node& n : g_.nodes())
      for (int in : n.inputs)
        if (vstage(in) >= 0 && stage(n.id) >= 0 && stage(n.id) != vstage(in))
          readers_[size_t(in)].insert(stage(n.id));
    for (int v : old_.outputs)
      for (int64_t t = 0; t < pl_.stages; ++t)
        if (vstage(v) >= 0 && t != vstage(v)) readers_[size_t(v)].insert(t);
    std::map<std::pair<int64_t, int64_t>, int64_t> next;
    for (size_t v = 0; v < readers_.size(); ++v)
      for (int64_t t : readers_[v]) tag_[{int(v), t}] = next[{vstage(int(v)), t}]++;
  }

  void ensure(int v) {
    if (rw_->map(v) >= 0) return;
    const ir::Value& val = g_.value(v);
    LOOM_CHECK(val.kind == ir::ValueKind::node) << "input %" << val.name << " not mapped";
    const int64_t from = vstage(v);
    if (from < 0 || from == s_) {
      emit(val.producer);
      return;
    }
    auto tag = tag_.find({v, s_});
    LOOM_CHECK(tag != tag_.end()) << "pipeline: no message for %" << val.name;
    const int r =
        rw_->graph().add_node(ir::Op::recv, {},
                              {{"axis", pl_.axis},
                               {"peer", from},
                               {"tag", tag->second},
                               {"shape", val.type.shape},
                               {"dtype", std::string(dtype_name(val.type.dtype))}},
                              {val.type}, {rw_->graph().unique_name(val.name + ".recv")})[0];
    rw_->alias(v, r);
  }

  void emit(int i) {
    if (emitted_[size_t(i)]) return;
    const ir::Node& n = g_.node(i);
    for (int in : n.inputs) ensure(in);
    emitted_[size_t(i)] = true;
    rw_->copy(n);
    for (int out : n.outputs)
      for (int64_t t : readers_[size_t(out)])
        rw_->graph().add_node(
            ir::Op::send, {rw_->map(out)},
            {{"axis", pl_.axis}, {"peer", t}, {"tag", tag_.at({out, t})}}, {{DType::i32, {}}},
            {rw_->graph().unique_name(fmt::format("{}.send{}", g_.value(out).name, t))});
  }

  Compilation& c_;
  const Pipelining& pl_;
  int64_t s_;
  shard::Program old_;  // a copy: its `local` forgets what the stage lacks before finish()
  const ir::Graph& g_;
  Rewriter* rw_ = nullptr;
  std::vector<int64_t> chunk_, mb_;  // per rank node
  std::vector<Phase> phase_;
  std::vector<bool> emitted_;
  std::vector<std::set<int64_t>> readers_;
  std::map<std::pair<int, int64_t>, int64_t> tag_;  // (value, reader stage) -> tag
};

void run_pipeline_stages(Compilation& c, const Options& o) {
  if (!shard::find_pipeline(o.plan)) return;
  if (!c.pipelining)
    throw Error(
        fmt::format("{}: pipeline: the training graph was compiled without the pipeline "
                    "tactic's micro-batches (pipeline_micro_batches)",
                    o.source));
  if (o.pipe_coord < 0 || o.pipe_coord >= c.pipelining->stages)
    throw Error(
        fmt::format("{}: pipeline: stage {} of {}", o.source, o.pipe_coord, c.pipelining->stages));
  StageCutter(c, o).run(o);
}

}  // namespace

Pass pipeline_stages_pass() {
  return {"pipeline_stages",
          "under a pipeline tactic, this rank's stage: its nodes in the schedule's order, send and "
          "recv between stages",
          Stage::scheduled, run_pipeline_stages};
}

}  // namespace loom::passes
