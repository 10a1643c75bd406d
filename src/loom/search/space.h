// The space of plans that plan search explores, as a sequence of decisions: how the devices factor
// into mesh axes (outermost first; the last axis is innermost, so it lies within a node: the
// placement), the role of each axis (which tactics go on it), and the pass settings (recompute;
// bucketing when ranks communicate; FSDP's reshard after forward when an axis is fsdp; P²'s
// synthesized reductions when ranks communicate and the cluster has several levels).
//
// A role is a small list of tactics on one axis: `data`, `zero1`/`zero2`/`fsdp` (each with `data`
// beside it, which splits the batch), `megatron`, `megatron+sequence`, `expert`, `pipeline`. A
// plan's tactic list is canonical: the pipeline first (no tactic may precede it), then
// tensor-parallel roles (their weights' splits win where they meet the stream's,
// docs/design.md), then expert, then the data-parallel roles, axes in mesh order; so the orders of
// one set of roles are not enumerated twice. The mesh axis is named after its role (`data`,
// `fsdp`, `zero1`, `zero2`, `model`, `expert`, `pipe`). A pipeline's schedule and micro-batches
// are one more decision (Candidate::schedule): 1f1b or interleaved (2 chunks a stage) with p, 2p
// or 4p micro-batches on p stages, where the batch divides.
//
// Pruning, before any simulation: a role at most once (two axes of one role are one axis of their
// product, which the mesh decision already offers) and one tensor-parallel axis; roles the model
// has nothing for (megatron without column/row-parallel weights, expert without experts, a
// pipeline of more stages than parameter groups, or beside a tied embedding or grad_accum); the
// batch divisible by its data-parallel axes (and a pipeline's micro-batches); and the compiler's
// own check: the tactics so far applied to the training graph (shard::apply_tactics) must accept
// the axis (a value split over an axis twice, a dim the axis does not divide). Pass settings that
// cannot matter are one option: bucketing on one device, reshard-after-forward without fsdp.
//
// The micro-batch size is not a decision yet: every candidate keeps the config's [train]
// grad_accum (which any plan runs: passes/micro_batch.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ir/roles.h"
#include "loom/passes/pass.h"
#include "loom/train/config.h"

namespace loom::search {

struct Role {
  std::string_view name;                  // "fsdp", "megatron+sequence"
  std::string_view axis;                  // the axis it is named on: "fsdp", "model"
  std::vector<std::string_view> tactics;  // on that axis, in plan order
  int order = 0;  // pipeline -1, tensor-parallel 0, expert 1, data-parallel 2
  bool splits_batch = false;
};
const std::vector<Role>& roles();

// One complete plan: a mesh, its axes' roles and the pass settings.
struct Candidate {
  std::vector<std::pair<std::string, int64_t>> mesh;  // outermost first
  std::vector<int> roles;                             // per axis, an index of roles()
  passes::ScheduleOptions::Recompute recompute = passes::ScheduleOptions::Recompute::none;
  passes::ScheduleOptions::Bucket bucket = passes::ScheduleOptions::Bucket::block;
  bool reshard_after_forward = true;
  bool synthesize = false;  // P²'s hierarchical reductions (passes/synthesize.cc)
  // with a pipeline axis: its schedule ("1f1b", "interleaved") and micro-batches per step
  std::string schedule;
  int64_t microbatches = 0;

  shard::Plan plan() const;              // the mesh and the canonical tactic list
  void apply(train::Config& cfg) const;  // cfg's [plan] and [passes] set to this candidate
  std::string key() const;               // one line, unique per candidate
  // [plan] and [passes] sections to paste into a config; `cluster`: the cluster file bucket =
  // "auto" decides on (the one the search predicted on)
  std::string toml(const std::string& cluster) const;
};

struct SpaceOptions {
  int64_t devices = 1;
  int max_axes = 3;
  std::vector<passes::ScheduleOptions::Recompute> recompute = {
      passes::ScheduleOptions::Recompute::none, passes::ScheduleOptions::Recompute::selective,
      passes::ScheduleOptions::Recompute::full};
  std::vector<passes::ScheduleOptions::Bucket> bucket = {
      passes::ScheduleOptions::Bucket::block, passes::ScheduleOptions::Bucket::automatic};
  // offer [passes] synthesize (where the cluster has levels a reduction can be split over)
  bool synthesize = false;
};

class Space {
 public:
  // `graph` and `roles`: cfg's training graph (passes::Stage::train) and its roles, which the
  // compiler's check applies tactics to. Throws loom::Error for devices < 1 or max_axes < 1.
  Space(const train::Config& cfg, const ir::Graph& graph, const ir::Roles& roles, SpaceOptions o);

  // The choices open after `prefix` (a decision sequence from the root): indices of the next
  // decision's options, pruned; empty when the prefix is a complete candidate, and for a dead end
  // (a prefix whose every continuation is pruned, which is not complete).
  std::vector<int> options(const std::vector<int>& prefix) const;
  bool complete(const std::vector<int>& prefix) const;
  Candidate candidate(const std::vector<int>& decisions) const;
  // Every complete decision sequence, in order (the exhaustive baseline).
  std::vector<std::vector<int>> enumerate() const;

  // The candidates one move from complete `d`, as complete decision sequences, in this order:
  //   - one decision changed, the deepest first (a pass setting, then an axis's role, then the
  //     mesh), the later decisions kept where they are still open, else the first open option;
  //   - two axes swapped, sizes and roles together: the same tactics placed otherwise on the
  //     cluster's levels (which axis lies within a node);
  //   - two axes merged into one of their product, in the place of either, with either's role.
  // A move that leaves the space (a pruned role, a mesh of too many axes) is not offered.
  std::vector<std::vector<int>> neighbours(const std::vector<int>& d) const;

 private:
  bool role_ok(const std::vector<int>& prefix, int axis, int role) const;
  // The decision sequence of the candidate with these axes (sizes and role indices) and pass
  // decisions `tail` (as a decision sequence's after its roles: each kept where it is open, else
  // the first open option); empty where the axes are not in the space.
  std::vector<int> with_axes(const std::vector<int64_t>& sizes, const std::vector<int>& roles,
                             const std::vector<int>& tail) const;

  const train::Config& cfg_;
  const ir::Graph& graph_;
  const ir::Roles& roles_;
  SpaceOptions o_;
  std::vector<std::vector<int64_t>> meshes_;      // ordered factorizations of the device count
  mutable std::map<std::string, bool> accepted_;  // the compiler's check, per tactic prefix
  bool tied_ = false;  // an embedding table is also a matmul's weight: no pipeline
};

}  // namespace loom::search
