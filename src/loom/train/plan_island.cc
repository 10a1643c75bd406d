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
  share(true, true, true);
  moves_ = {};  // counted from the first sync
}

bool PlanIsland::share(bool go, bool gathered, bool changed) {
  if (island_) clock_ = island_->clock();
  int64_t state[7] = {0, 0, go ? 1 : 0, clock_.on ? 1 : 0, clock_.t, clock_.now, changed ? 1 : 0};
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
  if (gathered || state[6]) runner_.release_params();
  moves_.broadcast += state[6];
  return state[2] != 0;
}

bool PlanIsland::sync(int64_t steps, double seconds, bool last) {
  bool gathered = false, changed = false, go = true;
  auto gather = [&] {
    runner_.push_params();  // every rank: the whole parameters in its store
    gathered = true;
  };
  if (island_) {
    island_->on_params([&](bool writes) {
      if (!gathered) {
        int64_t c = kGather;
        world_.broadcast(&c, sizeof c, 0);
        gather();
      }
      changed |= writes;
    });
    try {
      go = island_->sync(steps, seconds, last);
    } catch (...) {
      island_->on_params(nullptr);
      throw;
    }
    island_->on_params(nullptr);
    int64_t c = kDone;
    world_.broadcast(&c, sizeof c, 0);
  } else {
    for (;;) {
      int64_t c = 0;
      world_.broadcast(&c, sizeof c, 0);
      if (c == kDone) break;
      LOOM_CHECK(c == kGather && !gathered) << "plan island: unexpected command " << c;
      gather();
    }
  }
  ++moves_.syncs;
  moves_.gathered += gathered;
  return share(go, gathered, changed);
}

nlohmann::json PlanIsland::metrics() const {
  return island_ ? island_->metrics() : nlohmann::json::object();
}

std::string PlanIsland::summary() const { return island_ ? island_->summary() : ""; }

}  // namespace loom::train
