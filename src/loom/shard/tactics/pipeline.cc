// pipeline: pipeline parallelism. The model is cut into p * v chunks (p the axis's ranks, v the
// virtual stages: 1, or more under the interleaved schedule) at parameter-group boundaries
// (roles.blocks: the embedding, each transformer block, the head), balanced by the groups' matmul
// weights; rank s of the axis holds chunks s, s + p, s + 2p, ..., runs their part of every
// micro-batch, and the ranks pass activations forward and their gradients back by send and recv
// in the tactic's schedule (passes/pipeline_stages.cc). It splits no value: over its axis every
// tensor is whole, and no other tactic may use the axis.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

const Tactic* find_pipeline(const Plan& plan) {
  for (const Tactic& t : plan.tactics)
    if (t.kind == "pipeline") return &t;
  return nullptr;
}

int64_t pipeline_microbatches(const Plan& plan, const Tactic& t) {
  if (t.microbatches > 0) return t.microbatches;
  if (!plan.mesh.has(t.axis))
    throw Error(fmt::format("{}: the pipeline's axis '{}' is not in the mesh {}", plan.where,
                            t.axis, plan.mesh.to_string()));
  return plan.mesh.axis_size(t.axis);
}

int64_t pipeline_virtual_stages(const Tactic& t) {
  if (t.schedule != "interleaved") return 1;
  return t.virtual_stages > 0 ? t.virtual_stages : 2;
}

void check_pipeline_keys(const Tactic& t, const std::string& at) {
  // micro-batches at most [train] batch_size's limit; chunks at most n_layers'
  if (t.microbatches > (int64_t(1) << 20))
    throw Error(fmt::format("{}: microbatches = {}: at most 2^20", at, t.microbatches));
  if (t.virtual_stages > 1024)
    throw Error(fmt::format("{}: virtual_stages = {}: at most 1024", at, t.virtual_stages));
  if (t.schedule != "gpipe" && t.schedule != "1f1b" && t.schedule != "interleaved")
    throw Error(
        fmt::format("{}: schedule '{}' is not one of gpipe, 1f1b, interleaved", at, t.schedule));
  if (t.schedule != "interleaved" && t.virtual_stages > 1)
    throw Error(fmt::format("{}: virtual_stages = {} under schedule '{}', which runs one model "
                            "chunk per stage",
                            at, t.virtual_stages, t.schedule),
                "schedule = \"interleaved\" to give each stage several chunks");
  if (t.schedule == "interleaved" && t.virtual_stages == 1)
    throw Error(fmt::format("{}: the interleaved schedule with virtual_stages = 1 is 1f1b", at),
                "virtual_stages >= 2, or schedule = \"1f1b\"");
}

TacticDef pipeline_tactic() {
  return {.name = "pipeline",
          .summary = "cut the model into stages at parameter groups, one per rank of the axis",
          .selects = "roles.blocks",
          .not_after = {"data", "fsdp", "zero1", "zero2", "megatron", "sequence", "expert", "shard",
                        "pipeline"},
          .apply = [](TacticContext& c, const Tactic& t) {
            for (size_t i = 0; i < c.plan().tactics.size(); ++i) {
              const Tactic& o = c.plan().tactics[i];
              if (&o != &t && o.axis == t.axis)
                throw Error(
                    fmt::format("{}: axis '{}' also carries {}[{}] ({}): a pipeline's axis holds "
                                "its stages and nothing else",
                                c.by(), t.axis, c.plan().where + " tactics", i, o.kind),
                    "give the pipeline an axis of its own: mesh = { pipe = 2, data = 2 }");
              if (&o != &t && o.kind == "pipeline")
                throw Error(fmt::format("{}: a plan has at most one pipeline tactic", c.by()));
            }
            check_pipeline_keys(t, c.by());
          }};
}

}  // namespace loom::shard
