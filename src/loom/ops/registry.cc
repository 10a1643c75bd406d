// The op table and the helpers shared by op files.
#include <fmt/format.h>

#include <array>
#include <mutex>
#include <optional>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {
// One slot per ir::Op; filled once, then read without locks.
std::array<std::optional<OpDef>, ir::kOpCount>& table() {
  static std::array<std::optional<OpDef>, ir::kOpCount> t;
  return t;
}
const std::array<std::optional<OpDef>, ir::kOpCount>& registered() {
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
    for (int i = 0; i < ir::kOpCount; ++i)
      LOOM_CHECK(table()[size_t(i)])
          << "op " << Op(i) << " is in ir/op.h's list but no ops/ file registers it";
  });
  return table();
}
}  // namespace

void register_op(OpDef def) {
  const std::optional<Op> op = ir::find_op(def.name);
  LOOM_CHECK(op) << "op " << def.name << " is registered but not in ir/op.h's list";
  LOOM_CHECK(!table()[size_t(*op)]) << "op registered twice: " << def.name;
  LOOM_CHECK(def.infer && def.cost) << "op " << def.name << " lacks infer or cost";
  def.op = *op;
  table()[size_t(*op)] = std::move(def);
}

const OpDef& op_def(Op op) {
  const auto i = size_t(op);
  LOOM_CHECK(i < size_t(ir::kOpCount)) << "op id " << i << " out of range";
  return *registered()[i];
}

bool has_trait(Op op, Trait t) { return op_def(op).traits.has(t); }

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

std::vector<int> param_roots(const ir::Graph& g) {
  std::vector<int> root(g.values().size(), -1);
  for (const ir::Value& v : g.values())
    if (v.kind == ir::ValueKind::param) root[size_t(v.id)] = v.id;
  for (const ir::Node& n : g.nodes())
    if (n.op == Op::cast) root[size_t(n.outputs[0])] = root[size_t(n.inputs[0])];
  return root;
}

std::vector<Op> all_ops() {
  std::vector<Op> r;
  for (int i = 0; i < ir::kOpCount; ++i) r.push_back(Op(i));
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
