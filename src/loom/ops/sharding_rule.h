// Sharding rules: how an op's tensors may be split across a mesh, declared as data beside each op.
//
// A rule names the op's *factors* (Shardy's OpShardingRule): every dim of every operand and result
// is one factor, or several (major first) where a reshape merges dims. Splitting a factor over a
// mesh axis splits every dim that carries it, in every tensor, the same way. Factors come in three
// kinds:
//   - pass:   appears in a result; splitting it splits that result too (batch rows of a matmul);
//   - reduce: appears in operands but not in some result; splitting it leaves that result a pending
//             partial sum over the axis (the contraction dim of a matmul);
//   - fixed:  may not be split (the row of a norm, the keys of causal attention, a gathered vocab).
// A rule is written as an einsum-like spec over the op's types, for example
//     matmul (x @ W^T):  "*k,nk->*n"      rmsnorm:  "*C,C->*C,*"      reshape:  "*(hd)->*hd"
// where each letter is a factor, a capital letter is fixed, `*` stands for the leading dims (the
// same factors wherever it appears, aligned from the left), and `(hd)` is one dim made of factors h
// then d. Sizes are read from the types; a factor absent from a result is `reduce` for that result.
//
// `linear` lists the operands in which the op is jointly linear (add: both; mul_scalar: x): when
// all of them are partial sums over the same axes and no other operand is partial, the results stay
// partial over those axes and no collective is needed. `localize` fixes attributes that hold a
// global size when the op runs on a shard (a reshape's target shape, cross_entropy's row count).
//
// Not here: choosing shardings (shard/propagate), inserting collectives (shard/lower).
// Invariant: an op without a rule has every dim fixed, so it is always run replicated: correct,
// never silently wrong.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::ops {

enum class FactorKind : uint8_t { pass, reduce, fixed };

struct FactorRule {
  std::vector<int64_t> size;  // per factor
  std::vector<bool> fixed;    // per factor: may not be split
  // [tensor][dim] -> factors, major first (a plain dim has exactly one)
  std::vector<std::vector<std::vector<int>>> operands, results;
  std::vector<int> linear;  // operand indices (see above)

  int num_factors() const { return int(size.size()); }
  int add_factor(int64_t n, bool is_fixed) {
    size.push_back(n);
    fixed.push_back(is_fixed);
    return num_factors() - 1;
  }
  // The kind of factor f for result r.
  FactorKind kind(int f, int result) const;
};

using RuleFn = std::function<FactorRule(const std::vector<ir::TensorType>& in,
                                        const std::vector<ir::TensorType>& out, const ir::Attrs&)>;
// Adjusts `attrs` of a node about to run on local shapes (global and local types of its tensors).
using LocalizeFn = std::function<void(
    ir::Attrs& attrs, const std::vector<ir::TensorType>& global_in,
    const std::vector<ir::TensorType>& global_out, const std::vector<ir::TensorType>& local_out)>;

// What an op's `prepare` sees while lowering one of its nodes, and what it may add to the rank
// program before it (shard/lower.cc implements it).
class LowerContext {
 public:
  virtual ~LowerContext() = default;
  // The mesh axes factor f of the node's rule is split over, major first; empty: not split.
  virtual const std::vector<std::string>& factor_axes(int f) const = 0;
  virtual int64_t axis_size(const std::string& axis) const = 0;
  virtual const ir::TensorType& type(int local) const = 0;
  // Appends a node to the rank program (named after the node being lowered); its first result.
  virtual int emit(ir::Op op, std::vector<int> inputs, ir::Attrs attrs) = 0;
};
// Lowering a node whose kernel cannot run on its split factors from the shards alone: adjusts its
// local operands (and attributes) before it is emitted. An operand that indexes a split factor
// (token ids into a split vocabulary) is made relative to the rank's block (shard_index); a
// softmax over a split factor gets the other shards' statistics (cross_entropy). Runs for every
// node of the op; does nothing where nothing it cares about is split.
using PrepareFn = std::function<void(LowerContext& c, const FactorRule& rule,
                                     std::vector<int>& local_inputs, ir::Attrs& attrs)>;

struct ShardingRule {
  RuleFn rule;  // empty: every dim fixed
  LocalizeFn localize;
  PrepareFn prepare;
};

// `ids` (local i32 indices into a whole dim) relative to this rank's block of that dim, `block`
// entries, split over `axes` (major first): one shard_index per axis; an index outside the block
// becomes -1 (a kernel reading it skips that entry: the node carries attribute masked = 1). `ids`
// itself when `axes` is empty.
int index_into_block(LowerContext& c, int ids, const std::vector<std::string>& axes, int64_t block);

// Parses an einsum-like spec (above) against the types; LOOM_CHECKs that it fits them (a rule is
// code, not user input).
FactorRule einsum_rule(std::string_view spec, const std::vector<ir::TensorType>& in,
                       const std::vector<ir::TensorType>& out, std::vector<int> linear = {});
// Every dim of every tensor its own fixed factor: the op runs replicated.
FactorRule fixed_rule(const std::vector<ir::TensorType>& in,
                      const std::vector<ir::TensorType>& out);
// A rule from a fixed spec.
ShardingRule einsum(std::string spec, std::vector<int> linear = {});
// The rule of a node: its op's rule, or all-fixed when the op has none.
FactorRule factor_rule(const ir::Graph& g, const ir::Node& n);

}  // namespace loom::ops
