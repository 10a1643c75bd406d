// The op table and the helpers shared by op files.
#include <fmt/format.h>

#include <map>
#include <mutex>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {
std::map<std::string, OpDef, std::less<>>& table() {
  static std::map<std::string, OpDef, std::less<>> t;
  return t;
}
void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_elementwise_ops();
    register_linear_ops();
    register_norm_ops();
    register_attention_ops();
    register_loss_ops();
    register_layout_ops();
    register_optim_ops();
    register_collective_ops();
    register_moe_ops();
  });
}
}  // namespace

void register_op(OpDef def) {
  LOOM_CHECK(!table().count(def.name)) << "op registered twice: " << def.name;
  LOOM_CHECK(def.infer && def.cost) << "op " << def.name << " lacks infer or cost";
  std::string name = def.name;
  table().emplace(std::move(name), std::move(def));
}

const OpDef& op_def(std::string_view name) {
  ensure_registered();
  auto it = table().find(name);
  if (it == table().end()) throw Error(fmt::format("unknown op '{}'", name));
  return it->second;
}

bool has_trait(std::string_view name, Trait t) { return op_def(name).traits.has(t); }

int before_collectives(const ir::Graph& g, int value) {
  for (;;) {
    const ir::Value& v = g.value(value);
    if (v.kind != ir::ValueKind::node) return value;
    const ir::Node& n = g.node(v.producer);
    if (has_trait(n.op, Trait::completion))
      value = n.inputs[1];
    else if (has_trait(n.op, Trait::collective))
      value = n.inputs[0];
    else
      return value;
  }
}

bool has_op(std::string_view name) {
  ensure_registered();
  return table().find(name) != table().end();
}

std::vector<std::string> op_names() {
  ensure_registered();
  std::vector<std::string> r;
  for (const auto& [k, v] : table()) r.push_back(k);
  return r;
}

[[noreturn]] void type_error(std::string_view op, const std::vector<ir::TensorType>& in,
                             const std::string& why) {
  std::string types;
  for (size_t i = 0; i < in.size(); ++i) types += (i ? ", " : "") + ir::type_str(in[i]);
  throw Error(fmt::format("op {}({}): {}", op, types, why));
}

void expect_inputs(std::string_view op, const std::vector<ir::TensorType>& in, size_t n) {
  if (in.size() != n) type_error(op, in, fmt::format("expects {} inputs, got {}", n, in.size()));
}

Cost streaming_cost(const ir::Graph& g, const ir::Node& n, double flops_per_elem) {
  Cost c;
  for (int v : n.inputs) {
    const auto& t = g.value(v).type;
    c.bytes_read += double(numel(t.shape)) * dtype_size(t.dtype);
  }
  for (int v : n.outputs) {
    const auto& t = g.value(v).type;
    c.bytes_written += double(numel(t.shape)) * dtype_size(t.dtype);
  }
  if (!n.outputs.empty())
    c.flops = flops_per_elem * double(numel(g.value(n.outputs[0]).type.shape));
  return c;
}

}  // namespace loom::ops
