// An island made of a plan's ranks: an MPI job (or local ranks) with a [plan] that takes part in
// the outer loop (DiLoCo, async) as one island. Rank 0 is the island the server sees; every rank
// follows it through the world communicator.
//
// At each outer sync rank 0's island does what a one-process island does, and the other ranks
// follow its commands: before the island first reads the parameters (OuterSync::on_params) every
// rank gathers those it holds blocks of (push_params, collective); if the island changed them,
// rank 0 broadcasts them and every rank takes its blocks again (pull_params); a sync that touches
// no parameter (an async island's look at a push still awaited) moves none. The island's id (its
// data stream), its H, the server's `done` and the schedule's clock are broadcast at every sync,
// so every rank ends a round, and the run, at the same step, with the same lr.
// Invariant: every method is collective over the world communicator, called by every rank in the
// same order.
#pragma once

#include <cstdint>
#include <memory>

#include "loom/comm/communicator.h"
#include "loom/core/error.h"
#include "loom/train/loop.h"
#include "loom/train/step.h"

namespace loom::train {

class PlanIsland : public OuterSync {
 public:
  // `island`: rank 0's island, joined (its pull wrote the global parameters into rank 0's store);
  // null on every other rank. Broadcasts those parameters and takes every rank's blocks of them.
  PlanIsland(std::unique_ptr<OuterSync> island, ParamStore& params, StepRunner& runner,
             comm::Communicator& world);

  uint64_t id() const override { return id_; }
  int64_t inner_steps() const override { return h_; }
  bool sync(int64_t steps, double seconds, bool last) override;
  nlohmann::json metrics() const override;                 // rank 0's; {} on the others
  ScheduleClock clock() const override { return clock_; }  // rank 0's, on every rank
  std::string summary() const override;                    // rank 0's; "" on the others
  // A plan island moves its ranks' parameters itself (above): no hook is taken.
  void on_params(std::function<void(bool)> hook) override {
    LOOM_CHECK(!hook) << "a plan island moves its ranks' parameters itself";
  }
  // Syncs so far, and those that moved the parameters (gathered; broadcast when changed).
  struct Moves {
    int64_t syncs = 0, gathered = 0, broadcast = 0;
  };
  const Moves& moves() const { return moves_; }

 private:
  // rank 0's id, H, done and clock to every rank; when its island changed the parameters
  // (changed_) those too, of which every rank then takes its blocks; what was gathered is freed
  bool share(bool go);
  void gather();  // every rank's whole parameters into its store (collective)

  std::unique_ptr<OuterSync> island_;
  ParamStore& params_;
  StepRunner& runner_;
  comm::Communicator& world_;
  uint64_t id_ = 0;
  int64_t h_ = 1;
  ScheduleClock clock_;
  Moves moves_;
  bool gathered_ = false, changed_ = false;  // in the sync under way
};

}  // namespace loom::train
