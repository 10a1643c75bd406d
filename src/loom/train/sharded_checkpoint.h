// Sharded checkpoints: a run under a [plan] saves each rank's own blocks, never gathering a tensor
// whole. The checkpoint directory (checkpoint.h's protocol: written under a temp name, renamed
// when complete) holds, besides state.json and config.toml,
//
//   rank-00000.safetensors ...   rank r's blocks of the parameters (their Hugging Face names) and
//                                of the AdamW moments ("adam.m.<name>", "adam.v.<name>"), f32,
//                                each under the tensor's name, in the block's own shape
//   index.json                   {"format": "loom.sharded-checkpoint.1",
//                                 "mesh": [["data", 4]],
//                                 "model": {"<name>": {"dtype": "f32",
//                                    "shape": [...],       as a whole file holds it (stored shape)
//                                    "grid": [...],        the shape the blocks are cut from
//                                    "sharding": "{data,_}",
//                                    "ranks": [0, 1, 2, 3]}},  the ranks whose file holds a block
//                                 "optimizer": {"adam.m.<name>": {...}, ...}}
//
// The two parts are what a whole checkpoint's model.safetensors and optimizer.safetensors hold.
//
// Each block is written once: by the lowest rank holding it (the rank whose coordinate is 0 on
// every mesh axis that does not split the tensor), so a tensor the plan keeps whole is in rank 0's
// file alone. A reader under any plan, or none, assembles whole tensors from the blocks
// (ShardedCheckpoint::get: the layout is the saving plan's sharding on the saving mesh), which
// train::Weights serves to every loader of weights (resume, loom sample, loom export, [model]
// init). Every file is checked against the index (missing rank file, a block of another shape, a
// tensor the index does not list, blocks that do not cover the tensor) and an error names the
// file and tensor.
//
// A rank of a sharded run reads only what it keeps (read_block: the saved blocks that overlap its
// own, each read from its file when needed, never a whole tensor it splits); get() assembles a
// whole tensor for those who need one (one process, exports).
//
// Written by checkpoint_writer.h (at once or asynchronously). Not here: ranks without one shared
// filesystem.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/safetensors.h"
#include "loom/shard/sharding.h"

namespace loom::train {

inline constexpr const char* kShardedIndex = "index.json";
inline constexpr const char* kShardedFormat = "loom.sharded-checkpoint.1";
std::string rank_file_name(int64_t rank);  // "rank-00003.safetensors"

// `dir` holds a sharded checkpoint's index.json.
bool is_sharded_checkpoint(const std::string& dir);

// One tensor as a rank of a sharded run holds it.
struct HeldTensor {
  std::string part;          // "model" or "optimizer"
  std::string name;          // the checkpoint's name for it
  Shape stored;              // the whole tensor's shape in files (ParamInfo::stored_shape)
  Shape grid;                // the shape the plan splits (the graph's)
  shard::Sharding sharding;  // partial sums never: a parameter or moment is whole or split
  float* data;               // this rank's block (local_shape(grid, sharding, mesh))
};

// Whether `rank` writes its block of a tensor kept under `s`: it is the lowest rank holding it.
bool writes_block(const shard::Sharding& s, const shard::Mesh& mesh, int64_t rank);
// What rank `rank`'s file holds: the blocks of `held` it writes, each in its block's shape.
std::vector<TensorToWrite> rank_file_tensors(const std::vector<HeldTensor>& held,
                                             const shard::Mesh& mesh, int64_t rank);
// The index of every rank's blocks (the same `held` on every rank but its data).
nlohmann::json sharded_index(const std::vector<HeldTensor>& held, const shard::Mesh& mesh);

// One part ("model" or "optimizer") of a sharded checkpoint, read: the index checked against the
// rank files at open(); each tensor assembled whole on its first get().
class ShardedCheckpoint {
 public:
  // Throws loom::Error naming the index or rank file and the tensor for any disagreement.
  static std::shared_ptr<ShardedCheckpoint> open(const std::string& dir,
                                                 const std::string& part = "model");
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  // The whole tensor (f32, its stored shape), valid while this object lives.
  const TensorView& get(const std::string& name) const;
  // The saved grid of tensor `name` (the shape its blocks are cut from).
  const Shape& grid(const std::string& name) const;
  // Rank `rank`'s block of tensor `name` as `sharding` keeps it on `mesh` (a plan other than the
  // saving one, or the same), into `dst` (local_shape(grid, sharding, mesh) floats): only the
  // saved blocks that overlap it are read, one at a time.
  void read_block(const std::string& name, const shard::Sharding& sharding, const shard::Mesh& mesh,
                  int64_t rank, float* dst) const;
  const std::string& index_path() const { return index_path_; }

 private:
  struct Entry {
    Shape stored, grid;
    shard::Sharding sharding;
    std::vector<int64_t> ranks;
  };
  std::string dir_, index_path_;
  shard::Mesh mesh_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> names_;
  std::map<int64_t, SafetensorsFile> files_;  // rank -> its file
  mutable std::map<std::string, std::pair<std::vector<float>, TensorView>> whole_;
};

}  // namespace loom::train
