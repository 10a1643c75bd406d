// Layout ops: reshape {shape}, transpose {perm}, split {sizes} along the last dim, concat along the
// last dim. They move or relabel data and do no arithmetic.
#include <fmt/format.h>

#include <numeric>

#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using ir::Attrs;
using ir::TensorType;
using Types = std::vector<TensorType>;

const std::vector<int64_t>& ints(std::string_view op, const Attrs& a, const char* key,
                                 const Types& in) {
  auto it = a.find(key);
  if (it == a.end() || !std::holds_alternative<std::vector<int64_t>>(it->second))
    type_error(op, in, fmt::format("needs int-list attribute '{}'", key));
  return std::get<std::vector<int64_t>>(it->second);
}

Cost copy_cost(const ir::Graph& g, const ir::Node& n) { return streaming_cost(g, n, 0); }

}  // namespace

void register_layout_ops() {
  register_op({.name = "reshape",
               .num_inputs = 1,
               .infer =
                   [](const Types& in, const Attrs& a) {
                     expect_inputs("reshape", in, 1);
                     Shape s = ints("reshape", a, "shape", in);
                     for (int64_t d : s)
                       if (d < 0) type_error("reshape", in, "negative dim in shape");
                     if (numel(s) != numel(in[0].shape))
                       type_error("reshape", in, "element count changes to " + shape_str(s));
                     return Types{{in[0].dtype, s}};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     return std::vector<int>{b.reshape(d[0], b.shape(n.inputs[0]))};
                   },
               // a reshape is a view: the runtime aliases its output to its input
               .cost = [](const ir::Graph&, const ir::Node&) { return Cost{}; },
               .view = true});

  register_op({.name = "transpose",
               .num_inputs = 1,
               .infer =
                   [](const Types& in, const Attrs& a) {
                     expect_inputs("transpose", in, 1);
                     const auto& p = ints("transpose", a, "perm", in);
                     const Shape& x = in[0].shape;
                     std::vector<bool> seen(x.size());
                     if (p.size() != x.size()) type_error("transpose", in, "perm rank mismatch");
                     Shape s;
                     for (int64_t i : p) {
                       if (i < 0 || i >= int64_t(x.size()) || seen[i])
                         type_error("transpose", in, "perm is not a permutation");
                       seen[i] = true;
                       s.push_back(x[i]);
                     }
                     return Types{{in[0].dtype, s}};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     const auto& p = n.attr_ints("perm");
                     std::vector<int64_t> inv(p.size());
                     for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = int64_t(i);
                     return std::vector<int>{
                         b.emit1("transpose", {d[0]}, {{"perm", inv}}, "grad.transpose")};
                   },
               .cost = copy_cost});

  register_op({.name = "split",
               .num_inputs = 1,
               .infer =
                   [](const Types& in, const Attrs& a) {
                     expect_inputs("split", in, 1);
                     const auto& sizes = ints("split", a, "sizes", in);
                     if (in[0].shape.empty() || in[0].dtype != DType::f32)
                       type_error("split", in, "expects f32 of rank >= 1");
                     if (std::accumulate(sizes.begin(), sizes.end(), int64_t(0)) !=
                         in[0].shape.back())
                       type_error("split", in, "sizes must add up to the last dim");
                     Types out;
                     for (int64_t s : sizes) {
                       Shape sh = in[0].shape;
                       sh.back() = s;
                       out.push_back({in[0].dtype, sh});
                     }
                     return out;
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     std::vector<int> parts;
                     for (size_t i = 0; i < d.size(); ++i) {
                       if (d[i] >= 0) parts.push_back(d[i]);
                       else
                         parts.push_back(b.emit1("fill", {},
                                                 {{"shape", b.shape(n.outputs[i])}, {"value", 0.0}},
                                                 "grad.zeros"));
                     }
                     return std::vector<int>{b.emit1("concat", parts, {}, "grad.concat")};
                   },
               .cost = copy_cost});

  register_op({.name = "concat",
               .num_inputs = -1,
               .infer =
                   [](const Types& in, const Attrs&) {
                     if (in.empty()) type_error("concat", in, "needs at least one input");
                     Shape s = in[0].shape;
                     if (s.empty() || in[0].dtype != DType::f32)
                       type_error("concat", in, "expects f32 of rank >= 1");
                     s.back() = 0;
                     for (const auto& t : in) {
                       Shape a = t.shape, b = in[0].shape;
                       if (a.size() != b.size() || t.dtype != in[0].dtype)
                         type_error("concat", in, "inputs differ in rank or dtype");
                       a.back() = b.back() = 0;
                       if (a != b) type_error("concat", in, "inputs differ outside the last dim");
                       s.back() += t.shape.back();
                     }
                     return Types{{in[0].dtype, s}};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     std::vector<int64_t> sizes;
                     for (int v : n.inputs) sizes.push_back(b.shape(v).back());
                     return b.emit("split", {d[0]}, {{"sizes", sizes}});
                   },
               .cost = copy_cost});
}

}  // namespace loom::ops
