#include "loom/sim/kernel_list.h"

#include <variant>

#include "loom/ops/linear.h"
#include "loom/ops/op.h"
#include "loom/sim/cost.h"

namespace loom::sim {

bool listed_kernel(const ir::Node& n) {
  return !ops::has_trait(n.op, ops::Trait::view) && !ops::has_trait(n.op, ops::Trait::collective) &&
         !ops::has_trait(n.op, ops::Trait::completion);
}

nlohmann::json kernel_json(const ir::Graph& g, const ir::Node& n) {
  nlohmann::json k;
  k["op"] = std::string(ir::op_name(n.op));
  nlohmann::json attrs = nlohmann::json::object();
  for (const auto& kv : n.attrs)  // a structured binding is not capturable in clang 14
    std::visit([&](const auto& x) { attrs[kv.first] = x; }, kv.second);
  k["attrs"] = attrs;
  auto types = [&](const std::vector<int>& ids) {
    nlohmann::json a = nlohmann::json::array();
    for (int id : ids) {
      const ir::TensorType& t = g.value(id).type;
      a.push_back({{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}});
    }
    return a;
  };
  k["inputs"] = types(n.inputs);
  k["outputs"] = types(n.outputs);
  const ops::OpDef& def = ops::op_def(n.op);
  const ops::Cost cost = def.cost ? def.cost(g, n) : ops::Cost{};
  k["dtype"] = std::string(dtype_name(node_dtype(g, n)));
  k["bytes"] = cost.bytes_read + cost.bytes_written;
  k["flops"] = cost.flops;
  if (is_gemm(n.op)) {
    const ops::MatmulDims d =
        n.op == ir::Op::matmul ? ops::matmul_dims(g, n) : ops::grouped_matmul_dims(g, n);
    k["gemm"] = {{"ta", int64_t(d.ta)}, {"tb", int64_t(d.tb)}, {"m", d.M}, {"n", d.N}, {"k", d.K},
                 {"batch", d.batch}};
  }
  return k;
}

std::string kernel_signature(const nlohmann::json& entry) {
  nlohmann::json s;
  for (const char* key : {"op", "attrs", "inputs", "outputs"})
    if (entry.contains(key)) s[key] = entry[key];
  return s.dump();
}

}  // namespace loom::sim
