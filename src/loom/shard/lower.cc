#include "loom/shard/lower.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "loom/core/error.h"
#include "loom/ir/text.h"
#include "loom/ops/op.h"

namespace loom::shard {

namespace {

class Lowerer {
 public:
  Lowerer(const ir::Graph& g, const Mesh& m, const Propagation& p)
      : g_(g), m_(m), p_(p), versions_(g.values().size()) {
    prog_.graph = ir::Graph(g.name() + ".rank");
    prog_.local.assign(g.values().size(), -1);
  }

  Program run() {
    for (const ir::Value& v : g_.values())
      if (v.kind != ir::ValueKind::node) {
        const Sharding& s = p_.value[size_t(v.id)];
        int id = prog_.graph.add_input(v.name, local_type(v.id, s), v.kind);
        keep(v.id, s, id);
        prog_.local[size_t(v.id)] = id;
      }
    for (const ir::Node& n : g_.nodes()) {
      lower_node(n);
      prog_.origin.resize(prog_.graph.nodes().size(), n.id);
    }
    for (int v : g_.outputs()) {
      Sharding whole = p_.value[size_t(v)];
      whole.partial.clear();
      int id = get(v, whole);
      prog_.graph.add_output(id);
      prog_.outputs.push_back(id);
    }
    prog_.origin.resize(prog_.graph.nodes().size(), -1);
    return std::move(prog_);
  }

 private:
  ir::TensorType local_type(int v, const Sharding& s) const {
    const ir::TensorType& t = g_.value(v).type;
    return {t.dtype, local_shape(t.shape, s, m_)};
  }

  static size_t common_prefix(const std::vector<std::string>& a,
                              const std::vector<std::string>& b) {
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return k;
  }

  void keep(int v, const Sharding& s, int local) { versions_[size_t(v)][to_string(s)] = local; }

  // The local id of global value v in sharding `want`, emitting a reshard from the sharding v is
  // kept in (once: later consumers reuse it).
  int get(int v, const Sharding& want) {
    auto& vs = versions_[size_t(v)];
    if (auto it = vs.find(to_string(want)); it != vs.end()) return it->second;
    const Sharding& have = p_.value[size_t(v)];
    int id = reshard(vs.at(to_string(have)), have, want, g_.value(v).name);
    keep(v, want, id);
    return id;
  }

  int emit(ir::Op op, std::vector<int> ins, ir::Attrs attrs, const std::string& base) {
    std::vector<ir::TensorType> in;
    for (int i : ins) in.push_back(prog_.graph.value(i).type);
    auto out = ops::op_def(op).infer(in, attrs);
    return prog_.graph.add_node(op, std::move(ins), std::move(attrs), out,
                                {fmt::format("{}.{}", base, op)})[0];
  }

  // Emits the collectives that turn local value `id`, sharded as `from`, into sharding `to` (see
  // lower.h for the order).
  int reshard(int id, Sharding from, const Sharding& to, const std::string& name) {
    LOOM_CHECK(from.dims.size() == to.dims.size()) << name;
    for (const auto& a : to.partial)
      LOOM_CHECK(std::find(from.partial.begin(), from.partial.end(), a) != from.partial.end())
          << "cannot make %" << name << " a partial sum over " << a << " (" << to_string(from)
          << " -> " << to_string(to) << ")";
    for (const std::string& a : std::vector<std::string>(from.partial)) {
      if (std::find(to.partial.begin(), to.partial.end(), a) != to.partial.end()) continue;
      const int64_t n = m_.axis_size(a);
      int dim = -1;
      for (size_t d = 0; d < to.dims.size() && dim < 0; ++d) {
        auto f = from.dims[d];
        f.push_back(a);
        const int64_t size = prog_.graph.value(id).type.shape[d];
        if (f.size() <= to.dims[d].size() && std::equal(f.begin(), f.end(), to.dims[d].begin()) &&
            size % n == 0)
          dim = int(d);
      }
      if (dim >= 0) {
        id = emit(ir::Op::reduce_scatter, {id}, {{"axis", a}, {"dim", int64_t(dim)}, {"n", n}},
                  name);
        from.dims[size_t(dim)].push_back(a);
      } else {
        id = emit(ir::Op::all_reduce, {id}, {{"axis", a}}, name);
      }
      from.partial.erase(std::find(from.partial.begin(), from.partial.end(), a));
    }
    // an axis that moves from the end of one dim's split to the end of another's: all_to_all
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t d = 0; d < from.dims.size() && !moved; ++d) {
        if (from.dims[d].empty() || common_prefix(from.dims[d], to.dims[d]) == from.dims[d].size())
          continue;
        const std::string a = from.dims[d].back();
        for (size_t d2 = 0; d2 < from.dims.size() && !moved; ++d2) {
          auto grown = from.dims[d2];
          grown.push_back(a);
          const int64_t n = m_.axis_size(a);
          if (d2 == d || grown.size() > to.dims[d2].size() ||
              !std::equal(grown.begin(), grown.end(), to.dims[d2].begin()) ||
              prog_.graph.value(id).type.shape[d2] % n)
            continue;
          id = emit(ir::Op::all_to_all, {id},
                    {{"axis", a}, {"split_dim", int64_t(d2)}, {"concat_dim", int64_t(d)}, {"n", n}},
                    name);
          from.dims[d].pop_back();
          from.dims[d2].push_back(a);
          moved = true;
        }
      }
    }
    for (size_t d = 0; d < from.dims.size(); ++d) {
      size_t k = common_prefix(from.dims[d], to.dims[d]);
      while (from.dims[d].size() > k) {
        const std::string a = from.dims[d].back();
        id = emit(ir::Op::all_gather, {id},
                  {{"axis", a}, {"dim", int64_t(d)}, {"n", m_.axis_size(a)}}, name);
        from.dims[d].pop_back();
      }
    }
    for (size_t d = 0; d < from.dims.size(); ++d)
      for (size_t k = from.dims[d].size(); k < to.dims[d].size(); ++k) {
        const std::string& a = to.dims[d][k];
        id = emit(ir::Op::shard_slice, {id},
                  {{"axis", a}, {"dim", int64_t(d)}, {"n", m_.axis_size(a)}}, name);
        from.dims[d].push_back(a);
      }
    LOOM_CHECK(from == to) << "reshard of %" << name << " ended at " << to_string(from) << ", not "
                           << to_string(to);
    return id;
  }

  void lower_node(const ir::Node& n) {
    const NodeSharding& ns = p_.node[size_t(n.id)];
    const ops::OpDef& def = ops::op_def(n.op);
    std::vector<int> ins;
    std::vector<ir::TensorType> gin, gout, lout;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      gin.push_back(g_.value(v).type);
      // one gathered copy of a split parameter for all its readers; gathering it again for each
      // (FSDP's reshard after forward) is the scheduled stage's reshard pass
      ins.push_back(get(v, ns.operands[i]));
    }
    std::vector<std::string> names;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      int v = n.outputs[j];
      gout.push_back(g_.value(v).type);
      lout.push_back(local_type(v, ns.results[j]));
      names.push_back(g_.value(v).name);
    }
    ir::Attrs attrs = n.attrs;
    if (def.sharding.localize) def.sharding.localize(attrs, gin, gout, lout);
    if (def.sharding.prepare) {
      Context ctx(*this, ns, names.empty() ? g_.value(n.inputs[0]).name : names[0]);
      def.sharding.prepare(ctx, ops::factor_rule(g_, n), ins, attrs);
    }
    std::vector<ir::TensorType> lin;
    for (int i : ins) lin.push_back(prog_.graph.value(i).type);
    auto inferred = def.infer(lin, attrs);
    for (size_t j = 0; j < lout.size(); ++j)
      LOOM_CHECK(inferred[j] == lout[j])
          << "lowering " << n.op << " -> %" << names[j] << ": the op infers "
          << ir::type_str(inferred[j]) << " from local inputs, the sharding "
          << to_string(ns.results[j]) << " gives " << ir::type_str(lout[j]);
    auto outs = prog_.graph.add_node(n.op, ins, attrs, lout, names);
    for (size_t j = 0; j < outs.size(); ++j) {
      int v = n.outputs[j];
      keep(v, ns.results[j], outs[j]);
      const Sharding& kept = p_.value[size_t(v)];
      int id = outs[j];
      if (!(kept == ns.results[j])) {  // a tactic (or a consumer) wants it kept another way
        id = reshard(outs[j], ns.results[j], kept, names[j]);
        keep(v, kept, id);
      }
      prog_.local[size_t(v)] = id;
    }
    // in-place updates of a graph input that ran on a resharded copy go back to the input's memory
    for (auto [o, i] : def.inplace) {
      int v = n.inputs[size_t(i)];
      if (g_.value(v).kind == ir::ValueKind::node) continue;
      int raw = versions_[size_t(v)].at(to_string(p_.value[size_t(v)]));
      if (ins[size_t(i)] == raw) continue;
      int back = reshard(outs[size_t(o)], ns.results[size_t(o)], p_.value[size_t(v)],
                         g_.value(n.outputs[size_t(o)]).name);
      prog_.graph.add_node(ir::Op::assign, {raw, back}, {}, {prog_.graph.value(raw).type},
                           {g_.value(v).name + ".assign"});
    }
  }

  // What an op's prepare hook sees of the node being lowered (ops/sharding_rule.h).
  class Context : public ops::LowerContext {
   public:
    Context(Lowerer& l, const NodeSharding& ns, std::string base)
        : l_(l), ns_(ns), base_(std::move(base)) {}
    const std::vector<std::string>& factor_axes(int f) const override {
      return ns_.factor_axes[size_t(f)];
    }
    int64_t axis_size(const std::string& axis) const override { return l_.m_.axis_size(axis); }
    const ir::TensorType& type(int local) const override {
      return l_.prog_.graph.value(local).type;
    }
    int emit(ir::Op op, std::vector<int> inputs, ir::Attrs attrs) override {
      return l_.emit(op, std::move(inputs), std::move(attrs), base_);
    }

   private:
    Lowerer& l_;
    const NodeSharding& ns_;
    std::string base_;
  };

  const ir::Graph& g_;
  const Mesh& m_;
  const Propagation& p_;
  std::vector<std::map<std::string, int>> versions_;  // per global value: sharding text -> local id
  Program prog_;
};

}  // namespace

Program lower(const ir::Graph& g, const Mesh& mesh, const Propagation& p) {
  return Lowerer(g, mesh, p).run();
}

std::string print_sharded(const ir::Graph& g, const Propagation& p) {
  return ir::print(g, [&](int v) { return to_string(p.value[size_t(v)]); });
}

}  // namespace loom::shard
