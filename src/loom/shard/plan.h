// Plan and tactics: how a training graph is split across a mesh, kept apart from the model.
//
// A Plan is a mesh and an ordered list of tactics (the `[plan]` section of a config). Each tactic
// is a small function that sets the sharding of chosen values of the global graph; propagation
// (propagate.h) fills in every other value. Earlier tactics win where two annotations meet in one
// op (their priority is their position in the list).
//
// The built-in tactics are a table (tactic.h: data, fsdp, zero1, zero2, megatron, sequence, expert,
// shard), one file each under shard/tactics/ saying what it splits; docs/plans.md is the user's
// guide.
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
  std::string kind;  // a TacticDef's name (tactic.h)
  std::string axis;
  std::string pattern;  // shard only
  int64_t dim = -1;     // shard only
  // pipeline only: the schedule (gpipe, 1f1b, interleaved), the micro-batches a step's batch is
  // cut into (0: as many as the axis has stages) and, interleaved, the model chunks each stage
  // holds (0: 2)
  std::string schedule = "1f1b";
  int64_t microbatches = 0;
  int64_t virtual_stages = 0;
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
  // open: the tactic names the splits of some dims and leaves the others to propagation (sequence
  // splits the stream's time dim; data, wherever it comes in the list, still splits its batch)
  bool open = false;
  std::string by;  // "[plan] tactics[0] (fsdp)"
};

using Annotations = std::map<int, Annotation>;  // value id -> annotation

// Applies the plan's tactics in order; they find values by the roles the model declared (never by
// name, except `shard`'s pattern, which is the user's). Graph inputs no tactic names are
// replicated. Throws loom::Error (see above).
Annotations apply_tactics(const ir::Graph& g, const Plan& plan, const ir::Roles& roles);

// The plan's pipeline tactic (tactics/pipeline.cc), or null; and its micro-batches per step.
const Tactic* find_pipeline(const Plan& plan);
int64_t pipeline_microbatches(const Plan& plan, const Tactic& pipeline);
// The model chunks each stage holds: 1 under gpipe and 1f1b; virtual_stages (default 2) under
// interleaved.
int64_t pipeline_virtual_stages(const Tactic& pipeline);
// A pipeline tactic's own keys (its schedule, virtual_stages) agree, or a clear error naming `at`.
void check_pipeline_keys(const Tactic& pipeline, const std::string& at);

// The names tactics accept (tactic.h's table), for the config parser's messages.
std::vector<std::string> tactic_kinds();

}  // namespace loom::shard
