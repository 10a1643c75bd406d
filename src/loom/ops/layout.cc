// Layout ops: reshape {shape}, transpose {perm}, split {sizes, axis} and concat {axis} (axis: the
// last dim when absent). They move or relabel data and do no arithmetic.
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

// split's and concat's axis: the attribute, or the last dim; checked against the rank.
int64_t axis_of(std::string_view op, const Attrs& a, const Types& in) {
  const int64_t rank = int64_t(in[0].shape.size());
  auto it = a.find("axis");
  if (it == a.end()) return rank - 1;
  if (!std::holds_alternative<int64_t>(it->second))
    type_error(op, in, "attribute 'axis' must be an int");
  const int64_t ax = std::get<int64_t>(it->second);
  if (ax < 0 || ax >= rank) type_error(op, in, fmt::format("axis {} is out of range", ax));
  return ax;
}

// the vjp's attributes: the same axis where one was given
Attrs axis_attr(const ir::Node& n) {
  Attrs a;
  if (n.has_attr("axis")) a["axis"] = n.attr_int("axis");
  return a;
}

}  // namespace

AxisView axis_view(const ir::Node& n, const Shape& s) {
  AxisView v;
  v.axis = n.attr_int("axis", int64_t(s.size()) - 1);
  for (int64_t d = 0; d < v.axis; ++d) v.rows *= s[size_t(d)];
  for (size_t d = size_t(v.axis) + 1; d < s.size(); ++d) v.inner *= s[d];
  return v;
}

void register_layout_ops() {
  // split and concat: the axis stays whole (each operand's own factor), the other dims split
  // freely (factors shared by every operand and result)
  auto axis_whole = [](const Types& in, const Types& out, const Attrs& a) {
    FactorRule r;
    for (size_t i = 0; i < in.size(); ++i) r.linear.push_back(int(i));
    const size_t ax = size_t(axis_of("split/concat", a, in)), rank = in[0].shape.size();
    std::vector<int> shared(rank, -1);
    for (size_t d = 0; d < rank; ++d)
      if (d != ax) shared[d] = r.add_factor(in[0].shape[d], false);
    auto dims = [&](const TensorType& t) {
      std::vector<std::vector<int>> ds;
      for (size_t d = 0; d < rank; ++d)
        ds.push_back({d == ax ? r.add_factor(t.shape[d], true) : shared[d]});
      return ds;
    };
    for (const auto& t : in) r.operands.push_back(dims(t));
    for (const auto& t : out) r.results.push_back(dims(t));
    return r;
  };

  register_op(
      {.name = "reshape",
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
       // reshape: dims are matched in groups of equal size from the left; a dim split into several
       // ((B,T,C) -> (B,T,NH,HS)) carries their factors major first, so splitting C splits NH. A
       // group that both splits and merges dims is fixed.
       .sharding = {.rule =
                        [](const Types& in, const Types& out, const Attrs&) {
                          const Shape &a = in[0].shape, &b = out[0].shape;
                          FactorRule r;
                          r.linear = {0};
                          r.operands.resize(1);
                          r.results.resize(1);
                          auto& da = r.operands[0];
                          auto& db = r.results[0];
                          // dims [k0, k1) of s, one factor each, appended to ds: the factors
                          // of the one dim they make up, major first. A size-1 dim among
                          // others is left out of it (its own whole factor), so that
                          // (C, 1, C) -> (C, C) splits the last C on either side.
                          auto merged = [&](const Shape& s, size_t k0, size_t k1,
                                            std::vector<std::vector<int>>& ds) {
                            std::vector<int> fs;
                            for (size_t k = k0; k < k1; ++k) {
                              const bool alone = s[k] == 1 && k1 - k0 > 1;
                              const int f = r.add_factor(s[k], alone);
                              ds.push_back({f});
                              if (!alone) fs.push_back(f);
                            }
                            return fs;
                          };
                          size_t i = 0, j = 0;
                          while (i < a.size() || j < b.size()) {
                            size_t i0 = i, j0 = j;
                            if (i == a.size() || j == b.size()) {  // trailing size-1 dims
                              if (i < a.size())
                                da.push_back({r.add_factor(a[i++], true)});
                              else
                                db.push_back({r.add_factor(b[j++], true)});
                              continue;
                            }
                            int64_t pa = a[i++], pb = b[j++];
                            while (pa != pb) {
                              if (pa < pb && i < a.size())
                                pa *= a[i++];
                              else if (pb < pa && j < b.size())
                                pb *= b[j++];
                              else
                                break;
                            }
                            const size_t na = i - i0, nb = j - j0;
                            if (pa != pb || (na > 1 && nb > 1)) {
                              for (size_t k = i0; k < i; ++k)
                                da.push_back({r.add_factor(a[k], true)});
                              for (size_t k = j0; k < j; ++k)
                                db.push_back({r.add_factor(b[k], true)});
                            } else if (na == 1) {  // one dim in, nb dims out
                              da.push_back(merged(b, j0, j, db));
                            } else {  // na dims in, one dim out
                              db.push_back(merged(a, i0, i, da));
                            }
                          }
                          return r;
                        },
                    .localize = [](Attrs& a, const Types&, const Types&,
                                   const Types& local_out) { a["shape"] = local_out[0].shape; }},
       .traits = {Trait::view}});

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
                         b.emit1(Op::transpose, {d[0]}, {{"perm", inv}}, "grad.transpose")};
                   },
               .cost = copy_cost,
               .sharding = {.rule = [](const Types& in, const Types& out, const Attrs& a) {
                 FactorRule r;
                 r.linear = {0};
                 r.operands.resize(1);
                 r.results.resize(1);
                 for (int64_t s : in[0].shape) r.operands[0].push_back({r.add_factor(s, false)});
                 for (int64_t p : std::get<std::vector<int64_t>>(a.at("perm")))
                   r.results[0].push_back(r.operands[0][size_t(p)]);
                 return r;
               }}});

  register_op(
      {.name = "split",
       .num_inputs = 1,
       .infer =
           [](const Types& in, const Attrs& a) {
             expect_inputs("split", in, 1);
             const auto& sizes = ints("split", a, "sizes", in);
             if (in[0].shape.empty() || (in[0].dtype != DType::f32 && in[0].dtype != DType::bf16))
               type_error("split", in, "expects f32 or bf16 of rank >= 1");
             const size_t ax = size_t(axis_of("split", a, in));
             if (std::accumulate(sizes.begin(), sizes.end(), int64_t(0)) != in[0].shape[ax])
               type_error("split", in, "sizes must add up to the split dim");
             Types out;
             for (int64_t s : sizes) {
               Shape sh = in[0].shape;
               sh[ax] = s;
               out.push_back({in[0].dtype, sh});
             }
             return out;
           },
       .vjp =
           [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
             std::vector<int> parts;
             for (size_t i = 0; i < d.size(); ++i) {
               if (d[i] >= 0)
                 parts.push_back(d[i]);
               else
                 parts.push_back(b.emit1(Op::fill, {},
                                         {{"shape", b.shape(n.outputs[i])}, {"value", 0.0}},
                                         "grad.zeros"));
             }
             return std::vector<int>{b.emit1(Op::concat, parts, axis_attr(n), "grad.concat")};
           },
       .cost = copy_cost,
       .sharding = {.rule = axis_whole}});

  register_op({.name = "concat",
               .num_inputs = -1,
               .infer =
                   [](const Types& in, const Attrs& attrs) {
                     if (in.empty()) type_error("concat", in, "needs at least one input");
                     Shape s = in[0].shape;
                     if (s.empty() || (in[0].dtype != DType::f32 && in[0].dtype != DType::bf16))
                       type_error("concat", in, "expects f32 or bf16 of rank >= 1");
                     const size_t ax = size_t(axis_of("concat", attrs, in));
                     s[ax] = 0;
                     for (const auto& t : in) {
                       Shape a = t.shape, b = in[0].shape;
                       if (a.size() != b.size() || t.dtype != in[0].dtype)
                         type_error("concat", in, "inputs differ in rank or dtype");
                       a[ax] = b[ax] = 0;
                       if (a != b) type_error("concat", in, "inputs differ outside the concat dim");
                       s[ax] += t.shape[ax];
                     }
                     return Types{{in[0].dtype, s}};
                   },
               .vjp =
                   [](Builder& b, const ir::Node& n, const std::vector<int>& d) {
                     const size_t ax = size_t(axis_view(n, b.shape(n.outputs[0])).axis);
                     std::vector<int64_t> sizes;
                     for (int v : n.inputs) sizes.push_back(b.shape(v)[ax]);
                     Attrs a = axis_attr(n);
                     a["sizes"] = sizes;
                     return b.emit(Op::split, {d[0]}, a);
                   },
               .cost = copy_cost,
               .sharding = {.rule = axis_whole}});
}

}  // namespace loom::ops
