#include "loom/shard/propagate.h"

#include <algorithm>
#include <deque>
#include <set>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::shard {

namespace {

constexpr int kPropagated = 1 << 20;  // priority of a sharding no tactic set
constexpr int kMaxSweeps = 16;

bool updates_in_place(const ir::Node& n, size_t i) {
  for (auto [o, in] : ops::op_def(n.op).inplace)
    if (size_t(in) == i) return true;
  return false;
}

std::vector<std::string> mesh_sorted(std::vector<std::string> axes, const Mesh& m) {
  std::sort(axes.begin(), axes.end(),
            [&](const std::string& a, const std::string& b) { return m.index(a) < m.index(b); });
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

class Propagator {
 public:
  Propagator(const ir::Graph& g, const Mesh& m, const Annotations& ann) : g_(g), m_(m), ann_(ann) {
    p_.value.resize(g.values().size());
    p_.explicit_.resize(g.values().size());
    p_.node.resize(g.nodes().size());
    prio_.resize(g.values().size());
    for (const ir::Value& v : g.values()) {
      auto it = ann.find(v.id);
      p_.explicit_[size_t(v.id)] = it != ann.end();
      open_.push_back(it != ann.end() && it->second.open);
      prio_[size_t(v.id)].assign(v.type.shape.size(), kPropagated);
      if (it != ann.end() && v.kind != ir::ValueKind::node)
        prio_[size_t(v.id)].assign(v.type.shape.size(), 2 * it->second.priority);
      p_.value[size_t(v.id)] =
          it != ann.end() ? it->second.sharding : Sharding::replicated(v.type.shape.size());
    }
    rules_.reserve(g.nodes().size());
    for (const ir::Node& n : g.nodes()) rules_.push_back(ops::factor_rule(g, n));
    // each value that is a term of a sum a tactic keeps split: that sum (result_wish)
    std::vector<int> readers(g.values().size(), 0);
    for (const ir::Node& n : g.nodes())
      for (int in : n.inputs) ++readers[size_t(in)];
    sum_of_.assign(g.values().size(), -1);
    for (auto n = g.nodes().rbegin(); n != g.nodes().rend(); ++n) {
      if (n->op != ir::Op::add || n->outputs.size() != 1) continue;
      const int out = n->outputs[0];
      for (int in : n->inputs)
        if (readers[size_t(in)] == 1)
          sum_of_[size_t(in)] = p_.explicit_[size_t(out)] ? out : sum_of_[size_t(out)];
    }
  }

  Propagation run() {
    for (p_.sweeps = 1; p_.sweeps <= kMaxSweeps; ++p_.sweeps) {
      bool changed = false;
      for (const ir::Node& n : g_.nodes()) changed |= visit(n);
      for (auto it = g_.nodes().rbegin(); it != g_.nodes().rend(); ++it) changed |= visit(*it);
      if (!changed) {
        p_.converged = true;
        break;
      }
    }
    p_.sweeps = std::min(p_.sweeps, kMaxSweeps);
    return std::move(p_);
  }

 private:
  // Priorities are per dim of a value. A tactic's priority counts for graph inputs (parameters,
  // batch): how they are stored is how ops should split. A tactic's sharding of an intermediate
  // value (a gradient kept split, the sequence stream) says how to keep it, not how its consumers
  // compute: it ranks with propagated ones. A split carries its origin's priority along as it
  // propagates (Shardy's priorities), just behind the origin's own (2p for a tactic's p-th
  // annotation of a graph input, 2p + 1 for what propagates from it): where megatron's split
  // weights meet sequence's split stream at a matmul, the weights' split wins and the stream is
  // gathered, as Megatron-LM's sequence parallelism does; where the expert tactic's split experts
  // meet the tokens it split by sequence, the experts' own split beats the one the tokens carried,
  // and the tokens move (an all-to-all). Per dim, not per value: a bf16 copy of the sequence-split
  // stream that also carries a batch split from megatron's weights must not lend that priority to
  // its sequence split.
  int priority(int v, size_t d) const { return prio_[size_t(v)][d]; }

  // Returns whether any value's sharding changed.
  bool visit(const ir::Node& n) {
    const ops::FactorRule& r = rules_[size_t(n.id)];
    const int nf = r.num_factors();
    // factors that are not the major factor of some dim cannot carry axes (a dim lists its axes
    // once)
    std::vector<bool> minor(size_t(nf), false);
    auto mark = [&](const std::vector<std::vector<std::vector<int>>>& side) {
      for (const auto& t : side)
        for (const auto& d : t)
          for (size_t k = 1; k < d.size(); ++k) minor[size_t(d[k])] = true;
    };
    mark(r.operands);
    mark(r.results);

    std::vector<const Sharding*> view(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i) view[i] = &operand_view(g_, p_, ann_, n, i);

    // Partial sums pass through the op's linear operands over the axes they all share (the others
    // are reduced first), provided no other operand is partial: add({|sum=data+model}, {|sum=data})
    // reduces the first over model and stays a partial sum over data.
    std::vector<std::string> pass;
    bool linear_ok = !r.linear.empty(), first = true;
    for (size_t i = 0; i < n.inputs.size() && linear_ok; ++i) {
      const auto& part = view[i]->partial;
      if (std::find(r.linear.begin(), r.linear.end(), int(i)) == r.linear.end()) {
        linear_ok = part.empty();
        continue;
      }
      if (first) {
        pass = part;
        first = false;
      } else {
        std::erase_if(pass, [&](const std::string& a) {
          return std::find(part.begin(), part.end(), a) == part.end();
        });
      }
    }
    if (!linear_ok) pass.clear();

    std::vector<Cand> cands;
    auto collect = [&](const Sharding& s, const std::vector<std::vector<int>>& dims, int v,
                       int order) {
      for (size_t d = 0; d < dims.size() && d < s.dims.size(); ++d)
        if (!s.dims[d].empty() && !dims[d].empty())
          cands.push_back({priority(v, d), order, dims[d][0], &s.dims[d],
                           !n.outputs.empty() && r.kind(dims[d][0], 0) == ops::FactorKind::reduce});
    };
    for (size_t i = 0; i < n.inputs.size(); ++i)
      collect(*view[i], r.operands[i], n.inputs[i], int(i));
    for (size_t j = 0; j < n.outputs.size(); ++j)
      collect(result_wish(n.outputs[j]), r.results[j], n.outputs[j], 1000 + int(j));
    // operands before results: a result's sharding (a tactic's choice of how to keep it, or a
    // consumer's wish) only fills factors its operands leave free; it is met by a reshard
    // otherwise. Among equals, a split that passes to the result before one that leaves it a
    // partial sum: the experts' weight gradient dW = dY^T X with dY split by sequence and X by
    // expert runs split by expert (no reduction of whole expert weights, no reshard of X).
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
      bool ra = a.order >= 1000, rb = b.order >= 1000;
      if (ra != rb) return rb;
      if (a.prio != b.prio) return a.prio < b.prio;
      if (a.reduces != b.reduces) return b.reduces;
      return a.order < b.order;
    });
    std::deque<std::vector<std::string>> led;  // the leading candidates' axes
    lead_with_results(n, r, view, cands, led);

    NodeSharding ns;
    ns.factor_axes.assign(size_t(nf), {});
    std::set<std::string> used(pass.begin(), pass.end());
    std::vector<int> factor_prio(size_t(nf), kPropagated);  // the priority each split came with
    for (const Cand& c : cands) {
      auto& fa = ns.factor_axes[size_t(c.factor)];
      if (!fa.empty() || r.fixed[size_t(c.factor)] || minor[size_t(c.factor)]) continue;
      // the axes in order while they are free; a result takes the free ones that lead its split
      // (an fsdp x megatron weight's gradient kept {[model, data]}, made where the batch has data
      // already: split by model, then reduce-scattered over data), an operand all or none
      std::vector<std::string> take;
      int64_t ways = 1;
      for (const auto& a : *c.axes) {
        if (used.count(a)) break;
        take.push_back(a);
        ways *= m_.axis_size(a);
      }
      const bool result = c.order >= 1000;
      if (take.empty() || (!result && take.size() < c.axes->size()) ||
          r.size[size_t(c.factor)] % ways)
        continue;
      fa = take;
      used.insert(take.begin(), take.end());
      factor_prio[size_t(c.factor)] = c.prio;
    }
    // the priority a split carries on from one of priority p: p's, propagated
    auto onward = [](int p) { return p == kPropagated ? p : p | 1; };
    // the priority dim d of a tensor with these factor dims carries on: its factor's
    auto carried = [&](const std::vector<std::vector<int>>& dims, size_t d) {
      return d < dims.size() && !dims[d].empty() ? onward(factor_prio[size_t(dims[d][0])])
                                                 : kPropagated;
    };

    auto project = [&](const std::vector<std::vector<int>>& dims) {
      Sharding s = Sharding::replicated(dims.size());
      for (size_t d = 0; d < dims.size(); ++d)
        if (!dims[d].empty()) s.dims[d] = ns.factor_axes[size_t(dims[d][0])];
      return s;
    };
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      Sharding s = project(r.operands[i]);
      if (std::find(r.linear.begin(), r.linear.end(), int(i)) != r.linear.end()) s.partial = pass;
      ns.operands.push_back(std::move(s));
    }
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      Sharding s = project(r.results[j]);
      std::vector<std::string> part = pass;
      for (int f = 0; f < nf; ++f)
        if (r.kind(f, int(j)) == ops::FactorKind::reduce)
          part.insert(part.end(), ns.factor_axes[size_t(f)].begin(),
                      ns.factor_axes[size_t(f)].end());
      s.partial = mesh_sorted(part, m_);
      ns.results.push_back(std::move(s));
    }

    bool changed = false;
    // forward: results not set by a tactic take what the node produces, keeping splits that their
    // consumers asked for on dims the node leaves whole
    // (an open annotation keeps its own splits and grows the node's on the dims it leaves whole)
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      int v = n.outputs[j];
      if (p_.explicit_[size_t(v)] && !open_[size_t(v)]) continue;
      const Sharding& old = p_.value[size_t(v)];
      std::vector<int>& prio = prio_[size_t(v)];
      // the base's splits stand and the other's fill the dims it leaves whole; each split keeps
      // the priority it came with (the node's factor's, or the one the value already carried)
      const bool open = open_[size_t(v)];
      const Sharding& other = open ? ns.results[j] : old;
      Sharding s = open ? old : ns.results[j];
      std::vector<int> pr(old.dims.size(), kPropagated);
      for (size_t d = 0; d < s.dims.size(); ++d) {
        const bool from_node = s.dims[d].empty() == open;  // whose split dim d ends with
        if (s.dims[d].empty() && !other.dims[d].empty() &&
            fits(s, other.dims[d], g_.value(v).type.shape[d]))
          s.dims[d] = other.dims[d];
        else if (s.dims[d].empty())
          continue;
        pr[d] = from_node ? carried(r.results[j], d) : prio[d];
      }
      const bool differs = !(s == old);
      for (size_t d = 0; d < s.dims.size(); ++d) {
        const int p = differs ? pr[d] : std::min(pr[d], prio[d]);
        changed |= p != prio[d];
        prio[d] = p;
      }
      if (differs) {
        p_.value[size_t(v)] = std::move(s);
        changed = true;
      }
    }
    // backward: operands not set by a tactic (or set open) grow the splits this node asks for
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (p_.explicit_[size_t(v)] && !open_[size_t(v)]) continue;
      Sharding& s = p_.value[size_t(v)];
      for (size_t d = 0; d < s.dims.size(); ++d) {
        const auto& want = ns.operands[i].dims[d];
        if (s.dims[d].empty() && !want.empty() && fits(s, want, g_.value(v).type.shape[d])) {
          s.dims[d] = want;
          prio_[size_t(v)][d] = std::min(prio_[size_t(v)][d], carried(r.operands[i], d));
          changed = true;
        }
      }
    }
    p_.node[size_t(n.id)] = std::move(ns);
    return changed;
  }

  // What a result asks of the node that makes it: its own sharding; or, where it has no split
  // and is a term of a sum of a value a tactic keeps split (read by one add, whose result is, or
  // is again such a term of, that value), the sum's: a gradient summed over a pipeline's
  // micro-batches asks each micro-batch's term for the gradient's split, as the whole batch's
  // gradient asks the op that makes it (the vocabulary-split embedding gradient of each
  // micro-batch, not a whole-table partial sum reduced after the sum). Whether the node can make
  // it so is still its operands' and lead_with_results' call.
  const Sharding& result_wish(int v) const {
    const Sharding& own = p_.value[size_t(v)];
    if (p_.explicit_[size_t(v)] || sum_of_[size_t(v)] < 0) return own;
    for (const auto& d : own.dims)
      if (!d.empty()) return own;
    return p_.value[size_t(sum_of_[size_t(v)])];
  }

  // One split a node's factor may take: from an operand (order = its index) or a result (1000 +
  // its index), with the priority it carries.
  struct Cand {
    int prio, order, factor;
    const std::vector<std::string>* axes;
    bool reduces = false;  // the factor is summed over in a result (a contraction dim)
  };

  // A result's split of a factor no operand carries (the vocabulary of an embedding's table
  // gradient) goes before the operands' splits it shares axes with when gathering those operands
  // moves fewer bytes than reducing the result they would leave partial: under megatron with
  // sequence, the table's gradient is made split by vocabulary from the stream's gradient
  // gathered in time (tokens x C), not from the time-split stream and then reduce-scattered
  // (V x C), as Megatron-LM does. Only the result's leading axes that no graph input (the batch)
  // is split on lead: the batch is never gathered over a data-parallel axis (fsdp keeps its
  // reduce-scatter; fsdp x megatron x sequence leads with model and reduce-scatters over data).
  // `led` keeps the axes of the candidates it inserts (stable addresses).
  void lead_with_results(const ir::Node& n, const ops::FactorRule& r,
                         const std::vector<const Sharding*>& view, std::vector<Cand>& cands,
                         std::deque<std::vector<std::string>>& led) const {
    auto ways = [&](const std::vector<std::string>& axes) {
      double w = 1;
      for (const auto& a : axes) w *= double(m_.axis_size(a));
      return w;
    };
    std::vector<bool> in_operand(size_t(r.num_factors()), false);
    for (const auto& t : r.operands)
      for (const auto& d : t)
        for (int f : d) in_operand[size_t(f)] = true;
    for (size_t i = 0; i < cands.size(); ++i) {
      const Cand c = cands[i];
      if (c.order < 1000 || in_operand[size_t(c.factor)]) continue;
      const int j = c.order - 1000;
      // the operand splits before it that reduce into this result, and the axes the batch holds
      std::vector<size_t> rivals;
      std::set<std::string> batch;
      for (size_t k = 0; k < i; ++k) {
        const Cand& o = cands[k];
        if (o.order >= 1000 || r.kind(o.factor, j) != ops::FactorKind::reduce) continue;
        rivals.push_back(k);
        if (g_.value(n.inputs[size_t(o.order)]).kind != ir::ValueKind::node)
          batch.insert(o.axes->begin(), o.axes->end());
      }
      std::vector<std::string> lead;
      for (const auto& a : *c.axes) {
        if (batch.count(a)) break;
        lead.push_back(a);
      }
      size_t first = i;
      double gather = 0;
      std::set<std::string> shared;
      for (size_t k : rivals) {
        const Cand& o = cands[k];
        std::vector<std::string> common;
        for (const auto& a : *o.axes)
          if (std::find(lead.begin(), lead.end(), a) != lead.end()) common.push_back(a);
        if (common.empty()) continue;
        first = std::min(first, k);
        const ir::TensorType& t = g_.value(n.inputs[size_t(o.order)]).type;
        gather += double(numel(local_shape(t.shape, *view[size_t(o.order)], m_))) *
                  double(dtype_size(t.dtype)) * ways(common);
        shared.insert(common.begin(), common.end());
      }
      if (first == i) continue;
      // left to the operands, the result keeps the axes before the first they take (a result
      // is granted a prefix of its split), and is reduced over the others
      std::vector<std::string> kept;
      for (const auto& a : *c.axes) {
        if (shared.count(a)) break;
        kept.push_back(a);
      }
      const ir::TensorType& out = g_.value(n.outputs[size_t(j)]).type;
      if (gather < double(numel(out.shape)) * double(dtype_size(out.dtype)) / ways(kept)) {
        Cand l = c;
        l.axes = &led.emplace_back(lead);
        cands.insert(cands.begin() + std::ptrdiff_t(first), l);
        ++i;  // c itself moved one on: it finds its factor split (or the rest of its axes taken)
      }
    }
  }

  // Whether `axes` may split a whole dim of size n of a value sharded as s.
  bool fits(const Sharding& s, const std::vector<std::string>& axes, int64_t n) const {
    int64_t ways = 1;
    for (const auto& a : axes) {
      if (s.uses(a)) return false;
      ways *= m_.axis_size(a);
    }
    return n % ways == 0;
  }

  const ir::Graph& g_;
  const Mesh& m_;
  const Annotations& ann_;
  std::vector<ops::FactorRule> rules_;
  std::vector<bool> open_;              // per value: an open annotation (plan.h)
  std::vector<int> sum_of_;             // per value: the kept sum it is a term of, or -1
  std::vector<std::vector<int>> prio_;  // per value, per dim: the priority its split carries
  Propagation p_;
};

}  // namespace

const Sharding& operand_view(const ir::Graph& g, const Propagation& p, const Annotations& ann,
                             const ir::Node& node, size_t i) {
  int v = node.inputs[i];
  auto it = ann.find(v);
  if (it != ann.end() && it->second.has_use && !updates_in_place(node, i)) return it->second.use;
  return p.value[size_t(v)];
}

Propagation propagate(const ir::Graph& g, const Mesh& mesh, const Annotations& ann) {
  return Propagator(g, mesh, ann).run();
}

}  // namespace loom::shard
