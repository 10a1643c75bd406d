#include "loom/train/plan_island.h"

#include "loom/core/error.h"
#include "loom/core/shape.h"

namespace loom::train {

namespace {

// What rank 0 tells the other ranks during a sync.
enum Command : int64_t { kGather = 1, kDone = 2 };

}  // namespace

PlanIsland::PlanIsland(std::unique_ptr<OuterSync> island, ParamStore& params, StepRunner& runner,
                       comm::Communicator& world)
    : island_(std::move(island)), params_(params), runner_(runner), world_(world) {
  LOOM_CHECK((world_.rank() == 0) == (island_ != nullptr)) << "rank 0, and only it, is the island";
  gathered_ = changed_ = true;  // rank 0's store holds the joined island's parameters
  share(true);
  moves_ = {};  // counted from the first sync
  // rank 0: before its island first reads the parameters, every rank gathers them
  if (island_)
    island_->on_params([this](bool writes) {
      if (!gathered_) {
        int64_t c = kGather;
        world_.broadcast(&c, sizeof c, 0);
        gather();
      }
      changed_ |= writes;
    });
}

bool PlanIsland::share(bool go) {
  if (island_) clock_ = island_->clock();
  int64_t state[7] = {0, 0, go ? 1 : 0, clock_.on ? 1 : 0, clock_.t, clock_.now, changed_ ? 1 : 0};
  if (island_) state[0] = int64_t(island_->id()), state[1] = island_->inner_steps();
  double rates[2] = {clock_.at, clock_.rate};
  world_.broadcast(state, sizeof state, 0);
  world_.broadcast(rates, sizeof rates, 0);
  id_ = uint64_t(state[0]);
  h_ = state[1];
  clock_ = {state[3] != 0, rates[0], rates[1], state[4], state[5]};
  if (state[6]) {
    for (const auto& p : params_.infos())
      world_.broadcast(params_.data(p.name), numel(p.shape) * int64_t(sizeof(float)), 0);
    runner_.pull_params();
  }
  if (gathered_ || state[6]) runner_.release_params();
  moves_.broadcast += state[6];
  return state[2] != 0;
}

void PlanIsland::gather() {
  runner_.push_params();  // every rank: the whole parameters in its store
  gathered_ = true;
}

bool PlanIsland::sync(int64_t steps, double seconds, bool last) {
  gathered_ = changed_ = false;
  bool go = true;
  if (island_) {
    go = island_->sync(steps, seconds, last);  // the hook gathers before its first read
    int64_t c = kDone;
    world_.broadcast(&c, sizeof c, 0);
  } else {
    for (;;) {
      int64_t c = 0;
      world_.broadcast(&c, sizeof c, 0);
      if (c == kDone) break;
      LOOM_CHECK(c == kGather && !gathered_) << "plan island: unexpected command " << c;
      gather();
    }
  }
  ++moves_.syncs;
  moves_.gathered += gathered_;
  return share(go);
}

nlohmann::json PlanIsland::metrics() const {
  return island_ ? island_->metrics() : nlohmann::json::object();
}

std::string PlanIsland::summary() const { return island_ ? island_->summary() : ""; }

}  // namespace loom::train
