#include "loom/passes/rewrite.h"

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::passes {

Rewriter::Rewriter(const shard::Program& old) : old_(old) {
  next_.graph = ir::Graph(old.graph.name());
  map_.assign(old.graph.values().size(), -1);
  for (const ir::Value& v : old.graph.values())
    if (v.kind != ir::ValueKind::node)
      map_[size_t(v.id)] = next_.graph.add_input(v.name, v.type, v.kind);
}

bool Rewriter::ready(const ir::Node& n) const {
  for (int v : n.inputs)
    if (map(v) < 0) return false;
  return true;
}

void Rewriter::copy(const ir::Node& n) {
  std::vector<int> ins;
  for (int v : n.inputs) {
    LOOM_CHECK(map(v) >= 0) << "rewrite: %" << old_.graph.value(v).name
                            << " used before it is made";
    ins.push_back(map(v));
  }
  const auto outs = copy_with(n, ins);
  for (size_t i = 0; i < outs.size(); ++i) alias(n.outputs[i], outs[i]);
}

std::vector<int> Rewriter::copy_with(const ir::Node& n, const std::vector<int>& inputs,
                                     const std::string& suffix) {
  std::vector<ir::TensorType> types;
  std::vector<std::string> names;
  for (int v : n.outputs) {
    types.push_back(old_.graph.value(v).type);
    names.push_back(old_.graph.value(v).name + suffix);
  }
  const auto outs = next_.graph.add_node(n.op, inputs, n.attrs, types, names);
  set_origin(int(next_.graph.nodes().size()) - 1, origin_of(n.id));
  return outs;
}

void Rewriter::set_origin(int node, int origin) {
  if (next_.origin.size() <= size_t(node)) next_.origin.resize(size_t(node) + 1, -1);
  next_.origin[size_t(node)] = origin;
}

int Rewriter::origin_of(int old_node) const {
  return size_t(old_node) < old_.origin.size() ? old_.origin[size_t(old_node)] : -1;
}

void Rewriter::alias(int old_value, int new_value) {
  LOOM_CHECK(map(old_value) < 0) << "rewrite: %" << old_.graph.value(old_value).name
                                 << " mapped twice";
  LOOM_CHECK(old_.graph.value(old_value).type == next_.graph.value(new_value).type)
      << "rewrite: %" << old_.graph.value(old_value).name << " replaced by a value of another type";
  map_[size_t(old_value)] = new_value;
}

shard::Program Rewriter::finish() {
  auto remap = [&](int v) {
    if (v < 0) return v;
    LOOM_CHECK(map(v) >= 0) << "rewrite: %" << old_.graph.value(v).name << " was dropped";
    return map(v);
  };
  next_.local.clear();
  for (int v : old_.local) next_.local.push_back(remap(v));
  next_.outputs.clear();
  for (int v : old_.outputs) next_.outputs.push_back(remap(v));
  next_.graph.set_outputs(next_.outputs);
  next_.origin.resize(next_.graph.nodes().size(), -1);
  return std::move(next_);
}

Uses uses_of(const ir::Graph& g) {
  Uses uses;
  for (const ir::Node& n : g.nodes())
    for (size_t i = 0; i < n.inputs.size(); ++i) uses[n.inputs[i]].push_back({n.id, int(i)});
  return uses;
}

int reduced_gradient_owner(const ir::Graph& g, const ir::Node& n, const Uses& uses) {
  if (n.op != ir::Op::reduce_scatter && n.op != ir::Op::all_reduce) return -1;
  int out = n.outputs[0];
  auto u = uses.find(out);
  // seen through reduce_cast's cast back to f32
  if (u != uses.end() && u->second.size() == 1) {
    const ir::Node& c = g.node(u->second[0].first);
    if (c.op == ir::Op::cast && g.value(c.outputs[0]).type.dtype == DType::f32) {
      out = c.outputs[0];
      u = uses.find(out);
    }
  }
  if (u == uses.end()) return -1;
  for (auto [node, slot] : u->second) {
    const ir::Node& c = g.node(node);
    if (slot == 1 && ops::has_trait(c.op, ops::Trait::optimizer)) return c.inputs[0];
    if (slot == 1 && c.op == ir::Op::add && g.value(c.inputs[0]).kind == ir::ValueKind::state)
      return c.inputs[0];
  }
  return -1;
}

std::vector<int> param_groups(const Compilation& c) {
  std::vector<int> group(c.rank.graph.values().size(), -1);
  const auto& blocks = c.model.roles.blocks;
  for (size_t b = 0; b < blocks.size(); ++b)
    for (int p : blocks[b].params)
      if (size_t(p) < c.rank.local.size() && c.rank.local[size_t(p)] >= 0)
        group[size_t(c.rank.local[size_t(p)])] = int(b);
  return group;
}

}  // namespace loom::passes
