// The collective ops of a per-rank program (ops/collective.cc) run on a Communicator per mesh axis.
//
// MeshComms splits a world communicator into one communicator per mesh axis (shard::Mesh): the
// ranks that differ only in that axis's coordinate, ranked by it. With the mesh {data = 2, model =
// 2} (rank = 2 * data + model), rank 3's `data` communicator holds ranks {1, 3} and its `model`
// communicator ranks {2, 3}.
//
// Layout: a collective over dim d of a local (outer, s, inner) tensor moves whole (s, inner)
// blocks; when outer > 1 the blocks are packed into rank order in a scratch buffer first, so the
// wire always carries contiguous per-rank blocks.
//
// Not here: choosing collectives (shard/lower.h), moving bytes (comm/).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/ir/graph.h"
#include "loom/shard/sharding.h"

namespace loom::runtime {

class MeshComms {
 public:
  // Collective over `world`, whose size must be the mesh's.
  MeshComms(comm::Communicator& world, const shard::Mesh& mesh);
  comm::Communicator& world() const { return world_; }
  // An axis's communicator, or a sub-group's (shard::Mesh::parse_group: "data[1:2]") that
  // prepare() made; LOOM_CHECKs that it exists.
  comm::Communicator& axis(const std::string& name) const;
  // Splits a communicator for each sub-group the program's collectives name: a collective call on
  // the world communicator, so every rank calls it with the same program (StepRunner does, after
  // checking that the ranks' collectives agree).
  void prepare(const ir::Graph& program) const;

 private:
  comm::Communicator& world_;
  shard::Mesh mesh_;
  mutable std::map<std::string, std::unique_ptr<comm::Communicator>> axes_;
};

// Whether an op runs here rather than as a CPU kernel: its traits say collective or rank_local.
bool runs_on_comms(ir::Op op);
// Whether this file has a kernel for op (the op coverage test asks).
bool has_collective_kernel(ir::Op op);
// Runs one collective node; ins/outs as for CPU kernels.
void run_collective(const ir::Graph& g, const ir::Node& n, void* const* ins, void* const* outs,
                    const MeshComms& comms);

}  // namespace loom::runtime
