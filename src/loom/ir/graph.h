// Graph, Node, Value: Loom's IR (its ops: op.h). A Graph is a straight-line program over tensors
// with static shapes.
//
// Values are graph inputs (param: trainable weight; state: persistent non-trained tensor such as
// optimizer moments; input: data fed every step) or the outputs of nodes. Nodes are kept in
// execution order; every node's inputs are defined before it (the verifier checks it). The Graph
// owns all nodes and values; everything else refers to them by integer id, which never changes once
// assigned. Value names are unique within a graph and are what the text form prints (`%name`).
//
// Not here: what an op means (ops/), sharding (shard/), memory (runtime/).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/shape.h"
#include "loom/ir/op.h"

namespace loom::ir {

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
};
std::string type_str(const TensorType& t);  // "f32[4,64]"

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;
using Attrs = std::map<std::string, AttrValue>;  // ordered: the text form is deterministic

enum class ValueKind : uint8_t { param, state, input, node };
std::string_view kind_name(ValueKind k);  // "param", "state", "input", "node"

struct Value {
  int id = -1;
  std::string name;
  TensorType type;
  ValueKind kind = ValueKind::node;
  int producer = -1;  // node id for kind == node
  int producer_output = 0;
};

struct Node {
  int id = -1;
  Op op{};
  Attrs attrs;
  std::vector<int> inputs;
  std::vector<int> outputs;

  int64_t attr_int(const std::string& key) const;  // LOOM_CHECKs presence and type
  int64_t attr_int(const std::string& key, int64_t dflt) const;
  double attr_float(const std::string& key) const;
  double attr_float(const std::string& key, double dflt) const;
  const std::string& attr_str(const std::string& key) const;
  const std::vector<int64_t>& attr_ints(const std::string& key) const;
  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
};

class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  // Adds a graph input (param, state or input). The name must be new.
  int add_input(std::string name, TensorType type, ValueKind kind);
  // Appends a node; its outputs get the given types and names (an empty name becomes "%<id>"-style
  // "t<id>"; a taken name gets a ".<n>" suffix). Returns the output value ids.
  std::vector<int> add_node(Op op, std::vector<int> inputs, Attrs attrs,
                            const std::vector<TensorType>& out_types,
                            const std::vector<std::string>& out_names);
  void add_output(int value);
  void set_outputs(std::vector<int> values);  // replaces the output list

  const Value& value(int id) const { return values_[id]; }
  Value& mutable_value(int id) {
    touch();
    return values_[id];
  }
  const Node& node(int id) const { return nodes_[id]; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& outputs() const { return outputs_; }
  std::vector<int> inputs_of_kind(ValueKind k) const;  // in declaration order

  int find(std::string_view name) const;            // -1 when absent
  void rename(int value, const std::string& name);  // the new name must be free
  std::string unique_name(std::string base) const;

  // Which state the graph is in: every change gives it a number no other graph's change gives,
  // and a copy keeps it, so two graphs of one version hold the same program (ops::verify keeps
  // its verdict per version: a compilation verifies after every pass, most of which leave the
  // global graph, or the rank program, as they were).
  uint64_t version() const { return version_; }

 private:
  void touch();  // a change: a new version

  uint64_t version_ = 0;  // 0: never changed (empty)
  std::string name_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<int> outputs_;
  std::unordered_map<std::string, int> by_name_;
  // unique_name's next suffix to try per base (names are never freed, so the ones below it are
  // taken): the k-th "grad.mm" costs O(1), not O(k) (a 1000-layer graph's names were quadratic)
  mutable std::unordered_map<std::string, int> next_suffix_;
};

}  // namespace loom::ir
