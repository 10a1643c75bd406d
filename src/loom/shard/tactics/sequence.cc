// sequence: Megatron sequence parallelism. The residual stream and the norms' outputs (every
// input and output of a Trait::norm node of rank >= 3) split on the time dim (dim 1), so the norms
// run on 1/n of the sequence; with megatron on the same axis, its all-reduces become a
// reduce-scatter into the sequence split and an all-gather out of it.
#include <algorithm>

#include "loom/ops/op.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

TacticDef sequence_tactic() {
  return {.name = "sequence",
          .summary = "the residual stream and the norms split on the time dim",
          .selects = "the inputs and outputs of Trait::norm nodes",
          .not_after = {"sequence", "pipeline"},
          .apply = [](TacticContext& c, const Tactic&) {
            const ir::Graph& g = c.graph();
            std::vector<int> stream;
            for (const ir::Node& n : g.nodes())
              if (ops::has_trait(n.op, ops::Trait::norm)) {
                stream.push_back(n.inputs[0]);
                stream.push_back(n.outputs[0]);
              }
            std::sort(stream.begin(), stream.end());
            stream.erase(std::unique(stream.begin(), stream.end()), stream.end());
            for (int v : stream)
              if (g.value(v).type.shape.size() >= 3) c.split(v, 1, /*open=*/true);  // batch: data's
          }};
}

}  // namespace loom::shard
