#include "loom/ir/op.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/suggest.h"

namespace loom::ir {

namespace {

constexpr std::array<std::string_view, kOpCount> kNames = {
#define LOOM_IR_OP_NAME(name) #name,
    LOOM_IR_OPS(LOOM_IR_OP_NAME)
#undef LOOM_IR_OP_NAME
};

}  // namespace

std::string_view op_name(Op op) {
  const auto i = size_t(op);
  return i < kNames.size() ? kNames[i] : std::string_view("?");
}

std::optional<Op> find_op(std::string_view name) {
  // 49 names: a linear scan is as fast as a map, and this runs when a node is made, not per step
  const auto it = std::find(kNames.begin(), kNames.end(), name);
  if (it == kNames.end()) return std::nullopt;
  return Op(it - kNames.begin());
}

Op parse_op(std::string_view name) {
  if (auto op = find_op(name)) return *op;
  const std::vector<std::string> known(kNames.begin(), kNames.end());
  const auto best = nearest(std::string(name), known);
  throw Error("unknown op '" + std::string(name) + "'",
              best ? "did you mean '" + *best + "'?" : "ops are listed in src/loom/ir/op.h");
}

}  // namespace loom::ir
