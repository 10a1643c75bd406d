#include "loom/train/plan_island.h"

#include "loom/core/error.h"
#include "loom/core/shape.h"

namespace loom::train {

PlanIsland::PlanIsland(std::unique_ptr<OuterSync> island, ParamStore& params, StepRunner& runner,
                       comm::Communicator& world)
    : island_(std::move(island)), params_(params), runner_(runner), world_(world) {
  LOOM_CHECK((world_.rank() == 0) == (island_ != nullptr)) << "rank 0, and only it, is the island";
  share(true);
}

bool PlanIsland::share(bool go) {
  for (const auto& p : params_.infos())
    world_.broadcast(params_.data(p.name), numel(p.shape) * int64_t(sizeof(float)), 0);
  runner_.pull_params();
  runner_.release_params();
  if (island_) clock_ = island_->clock();
  int64_t state[6] = {0, 0, go ? 1 : 0, clock_.on ? 1 : 0, clock_.t, clock_.now};
  if (island_) state[0] = int64_t(island_->id()), state[1] = island_->inner_steps();
  double rates[2] = {clock_.at, clock_.rate};
  world_.broadcast(state, sizeof state, 0);
  world_.broadcast(rates, sizeof rates, 0);
  id_ = uint64_t(state[0]);
  h_ = state[1];
  clock_ = {state[3] != 0, rates[0], rates[1], state[4], state[5]};
  return state[2] != 0;
}

bool PlanIsland::sync(int64_t steps, double seconds, bool last) {
  runner_.push_params();  // every rank: the whole parameters in its store
  const bool go = island_ ? island_->sync(steps, seconds, last) : true;
  return share(go);
}

nlohmann::json PlanIsland::metrics() const {
  return island_ ? island_->metrics() : nlohmann::json::object();
}

std::string PlanIsland::summary() const { return island_ ? island_->summary() : ""; }

}  // namespace loom::train
