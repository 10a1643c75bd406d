// RankBlocks: what one rank of a sharded run holds of the global tensors, and how it moves between
// its block and the whole: parameters split by the plan (this rank's block only), the batch's
// block, and gathers of any value's blocks into the whole tensor (for checkpoints and gradient
// checks).
//
// Parameters the plan splits live here, not in the ParamStore: push() gathers them into the store
// (collective), pull() takes this rank's blocks from it, release() frees the store's whole copies.
// Replicated parameters stay in the ParamStore. A RankBlocks may share another's parameter blocks
// (an evaluator beside its trainer: one copy, nothing to refresh).
//
// Not here: compiling (compile.h), running (step.h). Calls marked collective must be made by every
// rank in the same order.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/passes/pass.h"
#include "loom/runtime/collectives.h"
#include "loom/train/params.h"

namespace loom::train {

class RankBlocks {
 public:
  // c: the compiled step (sharded and lowered stages), kept by the caller.
  RankBlocks(const passes::Compilation& c, const shard::Mesh& mesh,
             const runtime::MeshComms& comms);

  int64_t rank() const { return comms_.world().rank(); }
  comm::Communicator& world() const { return comms_.world(); }
  const shard::Sharding& sharding(int v) const { return c_.propagation.value[size_t(v)]; }
  // Global value v's local (block) element count.
  int64_t block_elements(int v) const;

  // This rank's block of the whole tensor of global value v (f32 or i32: 4-byte elements).
  void take_block(int v, const void* whole, void* block) const;
  // The whole value of global value v from every rank's block (collective).
  std::vector<float> gather(int v, const float* block) const;

  // Parameters: this rank's block of split parameter `name`, allocated from `store`'s whole copy,
  // or shared with `share`'s (which must split it the same way).
  float* own_param(const std::string& name, ParamStore& store);
  float* share_param(const std::string& name, const RankBlocks& share);
  const std::map<std::string, float*>& params() const { return param_ptr_; }

  void push(ParamStore& store) const;  // collective
  void pull(ParamStore& store) const;
  void release(ParamStore& store) const;

 private:
  const passes::Compilation& c_;
  const shard::Mesh& mesh_;
  const runtime::MeshComms& comms_;
  std::map<std::string, std::vector<float>> own_;  // split parameters: this rank's own blocks
  std::map<std::string, float*> param_ptr_;        // every split parameter's block (own or shared)
};

}  // namespace loom::train
