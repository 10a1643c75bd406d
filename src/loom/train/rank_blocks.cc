#include "loom/train/rank_blocks.h"

#include <cstring>

#include "loom/core/error.h"

namespace loom::train {

RankBlocks::RankBlocks(const passes::Compilation& c, const shard::Mesh& mesh,
                       const runtime::MeshComms& comms)
    : c_(c), mesh_(mesh), comms_(comms) {}

int64_t RankBlocks::block_elements(int v) const {
  LOOM_CHECK(c_.rank.local[size_t(v)] >= 0)
      << "%" << c_.model.graph.value(v).name << " not in the rank program";
  return numel(c_.rank.graph.value(c_.rank.local[size_t(v)]).type.shape);
}

void RankBlocks::take_block(int v, const void* whole, void* block) const {
  shard::copy_block(whole, block, c_.model.graph.value(v).type.shape, 4, sharding(v), mesh_,
                    rank());
}

std::vector<float> RankBlocks::gather(int v, const float* block) const {
  const ir::TensorType& t = c_.model.graph.value(v).type;
  shard::Sharding s = sharding(v);
  s.partial.clear();
  const int64_t n = numel(shard::local_shape(t.shape, s, mesh_));
  comm::Communicator& world = comms_.world();
  std::vector<float> all(size_t(n * world.size())), full(size_t(numel(t.shape)));
  world.all_gather(block, all.data(), n * 4);
  for (int r = 0; r < world.size(); ++r)
    shard::copy_block_back(all.data() + r * n, full.data(), t.shape, 4, s, mesh_, r);
  return full;
}

float* RankBlocks::own_param(const std::string& name, ParamStore& store) {
  const int v = c_.model.graph.find(name);
  auto& buf = own_[name];
  buf.resize(size_t(block_elements(v)));
  take_block(v, store.data(name), buf.data());
  return param_ptr_[name] = buf.data();
}

float* RankBlocks::share_param(const std::string& name, const RankBlocks& share) {
  const int v = c_.model.graph.find(name);
  LOOM_CHECK(share.param_ptr_.count(name) &&
             share.sharding(share.c_.model.graph.find(name)) == sharding(v))
      << "a runner sharing parameter blocks must split %" << name << " the same way";
  return param_ptr_[name] = share.param_ptr_.at(name);
}

void RankBlocks::push(ParamStore& store) const {
  for (const auto& [name, ptr] : param_ptr_) {
    auto full = gather(c_.model.graph.find(name), ptr);
    store.restore(name);
    std::memcpy(store.data(name), full.data(), full.size() * 4);
  }
}

void RankBlocks::pull(ParamStore& store) const {
  for (const auto& [name, ptr] : param_ptr_)
    take_block(c_.model.graph.find(name), store.data(name), ptr);
}

void RankBlocks::release(ParamStore& store) const {
  for (const auto& [name, ptr] : param_ptr_) store.release(name);
}

}  // namespace loom::train
