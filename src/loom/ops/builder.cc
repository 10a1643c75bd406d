#include "loom/ops/builder.h"

namespace loom::ops {

std::vector<int> Builder::emit(Op op, std::vector<int> inputs, ir::Attrs attrs,
                               std::vector<std::string> names) {
  const OpDef& def = op_def(op);
  std::vector<ir::TensorType> in;
  for (int v : inputs) in.push_back(g_.value(v).type);
  std::vector<ir::TensorType> out = def.infer(in, attrs);
  for (auto& n : names)
    if (!n.empty()) n = scope_ + n;
  return g_.add_node(op, std::move(inputs), std::move(attrs), out, names);
}

int Builder::emit1(Op op, std::vector<int> inputs, ir::Attrs attrs, std::string name) {
  return emit(op, std::move(inputs), std::move(attrs), {std::move(name)})[0];
}

int Builder::matmul(int a, int b, bool ta, bool tb, std::string name, DType out) {
  ir::Attrs at{{"ta", int64_t(ta)}, {"tb", int64_t(tb)}};
  if (out != DType::f32) at["out"] = std::string(dtype_name(out));
  return emit1(Op::matmul, {a, b}, std::move(at), std::move(name));
}
int Builder::add(int a, int b, std::string name) {
  return emit1(Op::add, {a, b}, {}, std::move(name));
}
int Builder::mul(int a, int b, std::string name) {
  return emit1(Op::mul, {a, b}, {}, std::move(name));
}
int Builder::scale(int a, double s, std::string name) {
  return emit1(Op::scale, {a}, {{"s", s}}, std::move(name));
}
int Builder::cast(int a, DType to, std::string name) {
  if (type(a).dtype == to) return a;
  if (name.empty()) {  // "x" -> "x.bf16": a readable name without the scope prefix twice
    name = g_.value(a).name + "." + std::string(dtype_name(to));
    std::string saved = scope_;
    scope_.clear();
    int r = emit1(Op::cast, {a}, {{"to", std::string(dtype_name(to))}}, std::move(name));
    scope_ = saved;
    return r;
  }
  return emit1(Op::cast, {a}, {{"to", std::string(dtype_name(to))}}, std::move(name));
}
int Builder::reshape(int a, Shape s, std::string name) {
  if (shape(a) == s) return a;
  return emit1(Op::reshape, {a}, {{"shape", s}}, std::move(name));
}

}  // namespace loom::ops
