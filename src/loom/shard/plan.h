// Plan and tactics: how a training graph is split across a mesh, kept apart from the model.
//
// A Plan is a mesh and an ordered list of tactics (the `[plan]` section of a config). Each tactic
// is a small function that sets the sharding of chosen values of the global graph; propagation
// (propagate.h) fills in every other value. Earlier tactics win where two annotations meet in one
// op (their priority is their position in the list).
//
//   data     {axis}               split the batch inputs the model declares (tokens, targets) on
//   dim 0 fsdp     {axis}               ZeRO-3: parameters, gradients and AdamW moments stored
//   split over the
//                                 axis (on the first dim it divides, after the axes earlier tactics
//                                 put there); every consumer but the optimizer sees the parameter
//                                 as it was before this tactic, so it is all-gathered before use
//   zero1    {axis}               AdamW moments split; gradients all-reduced whole; the update runs
//   on
//                                 this rank's block and the new parameter is all-gathered back
//   zero2    {axis}               as zero1, with gradients reduce-scattered to the moments' blocks
//   megatron {axis}               Megatron-LM tensor parallel: the weights the model declares
//                                 column-parallel (Llama's q/k/v and gate/up) split by output
//                                 features, the row-parallel ones (o/down) by input features
//                                 (ir/roles.h); their gradients and moments alike
//   sequence {axis}               Megatron sequence parallel: the residual stream and the norms'
//                                 outputs split on the time dim (dim 1)
//   expert   {axis}               expert parallelism (GShard): the stacked expert weights of MoE
//                                 layers (ir::Roles::experts) split by expert (dim 0), with their
//                                 gradients and moments; the batch split too unless an earlier
//                                 tactic put this axis there; tokens reach their experts and come
//                                 back through all-to-alls
//   shard    {axis, pattern, dim} split dim `dim` of every graph input whose name matches the glob
//                                 `pattern` (`*` any run of characters)
//
// Errors (loom::Error, before anything runs): an unknown tactic or axis, a mesh whose size differs
// from the number of ranks, a dim not divisible by its axes, two tactics that put one axis on one
// value twice; each names the tactic (`[plan] tactics[1] (megatron)`), the value and the axis.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ir/roles.h"
#include "loom/shard/sharding.h"

namespace loom::shard {

struct Tactic {
  std::string kind;  // data | fsdp | zero1 | zero2 | megatron | sequence | expert | shard
  std::string axis;
  std::string pattern;  // shard only
  int64_t dim = -1;     // shard only
};

struct Plan {
  Mesh mesh;
  std::vector<Tactic> tactics;
  std::string where = "[plan]";  // for messages: the config file and section
  bool empty() const { return mesh.axes().empty(); }
};

// One explicit sharding set by a tactic.
struct Annotation {
  Sharding sharding;
  bool has_use = false;
  Sharding use;      // has_use: what consumers other than the value's in-place updater see (fsdp)
  int priority = 0;  // the tactic's index: lower wins
  std::string by;    // "[plan] tactics[0] (fsdp)"
};

using Annotations = std::map<int, Annotation>;  // value id -> annotation

// Applies the plan's tactics in order; they find values by the roles the model declared (never by
// name, except `shard`'s pattern, which is the user's). Graph inputs no tactic names are
// replicated. Throws loom::Error (see above).
Annotations apply_tactics(const ir::Graph& g, const Plan& plan, const ir::Roles& roles);

// The names tactics accept, for the config parser's messages.
const std::vector<std::string>& tactic_kinds();

}  // namespace loom::shard
