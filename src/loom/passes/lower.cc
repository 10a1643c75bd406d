// lower (stage lowered): the per-rank program, local shapes plus the collectives that reshard
// values between their producers and consumers (shard/lower.h).
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass lower_pass() {
  return {"lower", "the per-rank program: local shapes and collectives (SPMD)", Stage::lowered,
          [](Compilation& c, const Options& o) {
            c.rank = shard::lower(c.model.graph, o.plan.mesh, c.propagation);
          }};
}

}  // namespace loom::passes
