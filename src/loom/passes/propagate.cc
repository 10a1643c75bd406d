// propagate (stage sharded): every value's sharding from the tactics' annotations and the ops'
// sharding rules, forward and backward to a fixed point (shard/propagate.h).
#include "loom/passes/pipeline.h"

namespace loom::passes {

Pass propagate_pass() {
  return {"propagate", "a sharding for every value, from the op sharding rules, to a fixed point",
          Stage::sharded, [](Compilation& c, const Options& o) {
            c.propagation = shard::propagate(c.model.graph, o.plan.mesh, c.annotations);
          }};
}

}  // namespace loom::passes
