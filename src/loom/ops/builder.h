// Builder: appends nodes to a Graph with their output types inferred by the op registry. Models and
// autodiff build graphs only through it. A name scope prefixes the names of new values
// ("layers.0." + "q"), so the printed IR reads like the model.
#pragma once

#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ops/op.h"

namespace loom::ops {

class Builder {
 public:
  explicit Builder(ir::Graph& g) : g_(g) {}

  ir::Graph& graph() { return g_; }
  const ir::TensorType& type(int v) const { return g_.value(v).type; }
  const Shape& shape(int v) const { return g_.value(v).type.shape; }

  // Appends `op` and returns all of its outputs.
  std::vector<int> emit(Op op, std::vector<int> inputs, ir::Attrs attrs = {},
                        std::vector<std::string> names = {});
  // Appends a single-output op and returns its output.
  int emit1(Op op, std::vector<int> inputs, ir::Attrs attrs = {}, std::string name = "");

  void set_scope(std::string s) { scope_ = std::move(s); }
  const std::string& scope() const { return scope_; }

  // Common ops.
  int matmul(int a, int b, bool ta, bool tb, std::string name = "", DType out = DType::f32);
  int add(int a, int b, std::string name = "");
  int mul(int a, int b, std::string name = "");
  int scale(int a, double s, std::string name = "");
  int cast(int a, DType to, std::string name = "");
  int reshape(int a, Shape s, std::string name = "");

 private:
  ir::Graph& g_;
  std::string scope_;
};

}  // namespace loom::ops
