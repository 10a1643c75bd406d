// Collective ops: what shard/lower inserts where a consumer needs another sharding than its
// producer gives. They appear only in per-rank programs, so their shapes are local; `axis` names
// the mesh axis whose ranks take part and `n` is its size.
//
// all_gather(x) {axis, dim, n}        x's dim grows n-fold: the ranks' blocks in axis order
// reduce_scatter(x) {axis, dim, n}    sum over the axis, then keep this rank's 1/n block of dim
// all_reduce(x) {axis}                sum over the axis
// all_to_all(x) {axis, split_dim, concat_dim, n}
//                                     split_dim shrinks n-fold, concat_dim grows n-fold (block j of
//                                     split_dim goes to rank j; received blocks are concatenated)
// shard_slice(x) {axis, dim, n}       keep this rank's 1/n block of dim: no communication
// shard_index(ids) {axis, n, size}    i32 indices into a dim of `size` entries, made relative to
//                                     this rank's 1/n block of it; -1 outside the block (and where
//                                     ids is -1): a vocabulary-parallel embedding's or loss's
//                                     token ids (ops/sharding_rule.h's index_into_block)
// send(x) {axis, peer, tag} -> done  x to the rank of coordinate `peer` on the axis (a pipeline
//                                     stage's value another stage reads); returns once x may be
//                                     reused (the message is buffered); done is an i32[] token
// recv() {axis, peer, tag, shape, dtype}
//                                     the value the rank of coordinate `peer` sent with `tag`
// wait(h, x) -> y                     completes the asynchronous collective whose in-flight output
//                                     is h and whose input was x: y is h's memory, complete. A
//                                     collective with attribute async = 1 only starts: its output
//                                     may be read by its wait alone, and its input stays untouched
//                                     until then (x is an input of the wait, so the memory plan
//                                     keeps it and an in-place write before the wait is a
//                                     verifier error). passes/prefetch.cc makes these pairs.
// assign(dst, src) -> dst             copy src into dst's memory (an optimizer result returned to
//                                     its parameter's storage after a reshard; a gradient sum
//                                     kept across micro-batches); elementwise: dst, src and the
//                                     result share every dim's split, and a partial sum stays one
//                                     (a gradient sum kept unreduced)
//
// Not here: how the bytes move (comm/ and runtime/collectives.cc). No VJPs: collectives are
// inserted after autodiff, on the per-rank program.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

using Types = std::vector<ir::TensorType>;

int64_t int_attr(std::string_view op, const ir::Attrs& a, const char* key) {
  auto it = a.find(key);
  if (it == a.end() || !std::holds_alternative<int64_t>(it->second))
    throw Error(fmt::format("op {}: missing integer attribute '{}'", op, key));
  return std::get<int64_t>(it->second);
}

void check_axis(std::string_view op, const Types& in, const ir::Attrs& a) {
  auto it = a.find("axis");
  if (it == a.end() || !std::holds_alternative<std::string>(it->second))
    type_error(op, in, "needs a string attribute 'axis' naming a mesh axis");
}

// send and recv: the axis, the peer's coordinate on it and the message's tag
void check_peer(std::string_view op, const Types& in, const ir::Attrs& a) {
  check_axis(op, in, a);
  if (int_attr(op, a, "peer") < 0 || int_attr(op, a, "tag") < 0)
    type_error(op, in, "peer and tag must be >= 0");
}

int64_t dim_attr(std::string_view op, const Types& in, const ir::Attrs& a, const char* key) {
  int64_t d = int_attr(op, a, key);
  if (d < 0 || d >= int64_t(in[0].shape.size()))
    type_error(op, in, fmt::format("{} = {} is not a dim of the input", key, d));
  return d;
}

int64_t group_size(std::string_view op, const Types& in, const ir::Attrs& a) {
  int64_t n = int_attr(op, a, "n");
  if (n < 1) type_error(op, in, "n must be >= 1");
  return n;
}

Cost comm_cost(const ir::Graph& g, const ir::Node& n) {
  Cost c;
  const auto& t = g.value(n.inputs[0]).type;
  c.bytes_read = double(numel(t.shape)) * double(dtype_size(t.dtype));
  const auto& o = g.value(n.outputs[0]).type;
  c.bytes_written = double(numel(o.shape)) * double(dtype_size(o.dtype));
  return c;
}

// all_gather / reduce_scatter / shard_slice: one dim scaled by n (grow) or divided by n (shrink).
OpDef resize_dim(const char* name, bool grow, Trait trait) {
  return OpDef{.name = name,
               .num_inputs = 1,
               .infer = [name, grow](const Types& in, const ir::Attrs& a) -> Types {
                 expect_inputs(name, in, 1);
                 check_axis(name, in, a);
                 int64_t d = dim_attr(name, in, a, "dim"), n = group_size(name, in, a);
                 Shape s = in[0].shape;
                 if (grow) {
                   s[size_t(d)] *= n;
                 } else {
                   if (s[size_t(d)] % n)
                     type_error(name, in, fmt::format("dim {} is not divisible by {}", d, n));
                   s[size_t(d)] /= n;
                 }
                 return {{in[0].dtype, s}};
               },
               .cost = comm_cost,
               .traits = {trait}};
}

}  // namespace

void register_collective_ops() {
  register_op({.name = "wait",
               .num_inputs = 2,
               .infer =
                   [](const Types& in, const ir::Attrs&) {
                     expect_inputs("wait", in, 2);
                     return Types{in[0]};
                   },
               .cost = [](const ir::Graph&, const ir::Node&) { return Cost{}; },
               .traits = {Trait::view, Trait::completion}});
  register_op(resize_dim("all_gather", true, Trait::collective));
  register_op(resize_dim("reduce_scatter", false, Trait::collective));
  register_op(resize_dim("shard_slice", false, Trait::rank_local));
  register_op({.name = "shard_index",
               .num_inputs = 1,
               .infer = [](const Types& in, const ir::Attrs& a) -> Types {
                 expect_inputs("shard_index", in, 1);
                 check_axis("shard_index", in, a);
                 if (in[0].dtype != DType::i32) type_error("shard_index", in, "expects i32 ids");
                 const int64_t n = group_size("shard_index", in, a);
                 const int64_t size = int_attr("shard_index", a, "size");
                 if (size < 1 || size % n)
                   type_error("shard_index", in,
                              fmt::format("size {} is not a positive multiple of n = {}", size, n));
                 return {in[0]};
               },
               .cost = comm_cost,
               .traits = {Trait::rank_local}});
  register_op({.name = "send",
               .num_inputs = 1,
               .infer = [](const Types& in, const ir::Attrs& a) -> Types {
                 expect_inputs("send", in, 1);
                 check_peer("send", in, a);
                 return {{DType::i32, {}}};
               },
               .cost = comm_cost,
               .traits = {Trait::p2p}});
  register_op({.name = "recv",
               .num_inputs = 0,
               .infer = [](const Types& in, const ir::Attrs& a) -> Types {
                 expect_inputs("recv", in, 0);
                 check_peer("recv", in, a);
                 DType t = DType::f32;
                 auto it = a.find("dtype");
                 if (it == a.end() || !std::holds_alternative<std::string>(it->second) ||
                     !parse_dtype(std::get<std::string>(it->second), &t))
                   type_error("recv", in, "needs dtype = \"f32\", \"bf16\" or \"i32\"");
                 auto s = a.find("shape");
                 if (s == a.end() || !std::holds_alternative<std::vector<int64_t>>(s->second))
                   type_error("recv", in, "needs an int-list attribute 'shape'");
                 return {{t, std::get<std::vector<int64_t>>(s->second)}};
               },
               .cost =
                   [](const ir::Graph& g, const ir::Node& n) {
                     Cost c;
                     const auto& o = g.value(n.outputs[0]).type;
                     c.bytes_written = double(numel(o.shape)) * double(dtype_size(o.dtype));
                     return c;
                   },
               .traits = {Trait::p2p}});
  register_op({.name = "all_reduce",
               .num_inputs = 1,
               .infer = [](const Types& in, const ir::Attrs& a) -> Types {
                 expect_inputs("all_reduce", in, 1);
                 check_axis("all_reduce", in, a);
                 if (in[0].dtype == DType::i32) type_error("all_reduce", in, "cannot sum i32");
                 return {in[0]};
               },
               .cost = comm_cost,
               .reuse = {{0, 0}},
               .traits = {Trait::collective}});
  register_op({.name = "all_to_all",
               .num_inputs = 1,
               .infer = [](const Types& in, const ir::Attrs& a) -> Types {
                 expect_inputs("all_to_all", in, 1);
                 check_axis("all_to_all", in, a);
                 int64_t sd = dim_attr("all_to_all", in, a, "split_dim");
                 int64_t cd = dim_attr("all_to_all", in, a, "concat_dim");
                 int64_t n = group_size("all_to_all", in, a);
                 Shape s = in[0].shape;
                 if (s[size_t(sd)] % n)
                   type_error("all_to_all", in,
                              fmt::format("dim {} is not divisible by {}", sd, n));
                 s[size_t(sd)] /= n;
                 s[size_t(cd)] *= n;
                 return {{in[0].dtype, s}};
               },
               .cost = comm_cost,
               .traits = {Trait::collective}});
  register_op({.name = "assign",
               .num_inputs = 2,
               .infer = [](const Types& in, const ir::Attrs&) -> Types {
                 expect_inputs("assign", in, 2);
                 if (!(in[0] == in[1])) type_error("assign", in, "dst and src types differ");
                 return {in[0]};
               },
               .cost = comm_cost,
               .inplace = {{0, 0}},
               .sharding = einsum("*,*->*", {0, 1})});
}

}  // namespace loom::ops
