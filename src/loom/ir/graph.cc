#include "loom/ir/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

#include "loom/core/error.h"

namespace loom::ir {

std::string type_str(const TensorType& t) {
  return std::string(dtype_name(t.dtype)) + shape_str(t.shape);
}

std::string_view kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::param:
      return "param";
    case ValueKind::state:
      return "state";
    case ValueKind::input:
      return "input";
    case ValueKind::node:
      return "node";
  }
  return "?";
}

namespace {
template <class T>
const T& get_attr(const Node& n, const std::string& key) {
  auto it = n.attrs.find(key);
  LOOM_CHECK(it != n.attrs.end()) << "node " << n.op << " (#" << n.id << ") has no attr " << key;
  const T* v = std::get_if<T>(&it->second);
  LOOM_CHECK(v) << "node " << n.op << " attr " << key << " has the wrong type";
  return *v;
}
}  // namespace

int64_t Node::attr_int(const std::string& key) const { return get_attr<int64_t>(*this, key); }
int64_t Node::attr_int(const std::string& key, int64_t dflt) const {
  return has_attr(key) ? attr_int(key) : dflt;
}
double Node::attr_float(const std::string& key) const {
  auto it = attrs.find(key);
  if (it != attrs.end())
    if (auto* i = std::get_if<int64_t>(&it->second)) return double(*i);
  return get_attr<double>(*this, key);
}
double Node::attr_float(const std::string& key, double dflt) const {
  return has_attr(key) ? attr_float(key) : dflt;
}
const std::string& Node::attr_str(const std::string& key) const {
  return get_attr<std::string>(*this, key);
}
const std::vector<int64_t>& Node::attr_ints(const std::string& key) const {
  return get_attr<std::vector<int64_t>>(*this, key);
}

std::string Graph::unique_name(std::string base) const {
  if (base.empty()) base = fmt::format("t{}", values_.size());
  if (!by_name_.count(base)) return base;
  int& next = next_suffix_[base];
  for (int i = std::max(next, 1);; ++i) {
    std::string n = base + "." + std::to_string(i);
    if (!by_name_.count(n)) {
      next = i + 1;
      return n;
    }
  }
}

void Graph::touch() {
  static std::atomic<uint64_t> last{0};
  version_ = ++last;
}

int Graph::add_input(std::string name, TensorType type, ValueKind kind) {
  LOOM_CHECK(kind != ValueKind::node);
  touch();
  if (by_name_.count(name))
    throw Error(fmt::format("graph {}: duplicate value name %{}", name_, name));
  Value v;
  v.id = int(values_.size());
  v.name = std::move(name);
  v.type = std::move(type);
  v.kind = kind;
  by_name_[v.name] = v.id;
  values_.push_back(std::move(v));
  return values_.back().id;
}

std::vector<int> Graph::add_node(Op op, std::vector<int> inputs, Attrs attrs,
                                 const std::vector<TensorType>& out_types,
                                 const std::vector<std::string>& out_names) {
  touch();
  Node n;
  n.id = int(nodes_.size());
  n.op = op;
  n.attrs = std::move(attrs);
  n.inputs = std::move(inputs);
  for (int in : n.inputs) LOOM_CHECK(in >= 0 && in < int(values_.size())) << "bad input id " << in;
  for (size_t i = 0; i < out_types.size(); ++i) {
    Value v;
    v.id = int(values_.size());
    v.name = unique_name(i < out_names.size() ? out_names[i] : "");
    v.type = out_types[i];
    v.kind = ValueKind::node;
    v.producer = n.id;
    v.producer_output = int(i);
    by_name_[v.name] = v.id;
    n.outputs.push_back(v.id);
    values_.push_back(std::move(v));
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

void Graph::add_output(int value) {
  LOOM_CHECK(value >= 0 && value < int(values_.size()));
  touch();
  outputs_.push_back(value);
}

void Graph::set_outputs(std::vector<int> values) {
  for (int v : values) LOOM_CHECK(v >= 0 && v < int(values_.size()));
  touch();
  outputs_ = std::move(values);
}

std::vector<int> Graph::inputs_of_kind(ValueKind k) const {
  std::vector<int> r;
  for (const Value& v : values_)
    if (v.kind == k) r.push_back(v.id);
  return r;
}

void Graph::rename(int value, const std::string& name) {
  Value& v = values_[value];
  if (v.name == name) return;
  LOOM_CHECK(!by_name_.count(name)) << "rename to a taken name " << name;
  touch();
  by_name_.erase(v.name);
  v.name = name;
  by_name_[name] = value;
}

int Graph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? -1 : it->second;
}

}  // namespace loom::ir
