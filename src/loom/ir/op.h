// Op: the IR's closed vocabulary of ops, each an enumerator named once in LOOM_IR_OPS. A node holds
// its op as this id, resolved when the node is made (the builder, the text parser); code that asks
// "is this an all_gather?" compares ids (`n.op == Op::all_gather`), so a misspelt op is a compile
// error, never a comparison that is silently false.
//
// What an op means (types, gradient, cost, sharding rule, traits) is ops/'s business: each op file
// registers one OpDef per id, and the registry refuses to start if an id here has no definition or
// a definition names no id here. Kernels are found per (op, device) by runtime/.
//
// Adding an op: one X(name) line below, in its family's group, then its op file and its kernels
// (docs/extending.md).
//
// Invariant: op_name(find_op(s).value()) == s for every name s in the list; the ids are dense,
// 0 .. kOpCount - 1, so tables indexed by Op are plain arrays.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

// clang-format off
#define LOOM_IR_OPS(X)                                                                              \
  /* ops/elementwise.cc */                                                                        \
  X(add) X(mul) X(scale) X(mul_scalar) X(gelu) X(gelu_bwd) X(swiglu) X(swiglu_bwd) X(cast)         \
  X(sum) X(sumsq) X(sum_rows) X(broadcast_scalar) X(broadcast_rows) X(positions) X(positions_at)   \
  X(fill)                                                                                          \
  /* ops/linear.cc */                                                                              \
  X(matmul) X(embedding) X(embedding_bwd)                                                          \
  /* ops/norm.cc */                                                                                \
  X(rmsnorm) X(rmsnorm_bwd) X(layernorm) X(layernorm_bwd)                                          \
  /* ops/attention.cc */                                                                           \
  X(attention) X(attention_bwd) X(rope) X(rope_at) X(cached_attention)                             \
  /* ops/loss.cc */                                                                                \
  X(cross_entropy) X(softmax_stats)                                                                \
  /* ops/layout.cc */                                                                              \
  X(reshape) X(transpose) X(split) X(concat)                                                       \
  /* ops/optim.cc */                                                                               \
  X(adamw) X(clip_coef)                                                                            \
  /* ops/collective.cc */                                                                          \
  X(wait) X(all_gather) X(reduce_scatter) X(shard_slice) X(all_reduce) X(all_to_all) X(assign)     \
  X(shard_index) X(send) X(recv)                                                                   \
  /* ops/moe.cc */                                                                                 \
  X(moe_router) X(moe_router_bwd) X(moe_dispatch) X(moe_combine) X(grouped_matmul)                 \
  X(moe_gate_grad)
// clang-format on

namespace loom::ir {

enum class Op : uint16_t {
#define LOOM_IR_OP_ENUM(name) name,
  LOOM_IR_OPS(LOOM_IR_OP_ENUM)
#undef LOOM_IR_OP_ENUM
};

#define LOOM_IR_OP_COUNT(name) +1
inline constexpr int kOpCount = 0 LOOM_IR_OPS(LOOM_IR_OP_COUNT);
#undef LOOM_IR_OP_COUNT

std::string_view op_name(Op op);  // "all_gather"
// The op spelt `name`; nullopt for a name the IR does not know.
std::optional<Op> find_op(std::string_view name);
// The op spelt `name`; throws loom::Error naming it (with the nearest known spelling) otherwise.
Op parse_op(std::string_view name);

inline std::ostream& operator<<(std::ostream& os, Op op) { return os << op_name(op); }

}  // namespace loom::ir

template <>
struct fmt::formatter<loom::ir::Op> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(loom::ir::Op op, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(loom::ir::op_name(op), ctx);
  }
};
