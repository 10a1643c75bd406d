#include "loom/passes/pipeline.h"

#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/ir/text.h"
#include "loom/passes/verify.h"

namespace loom::passes {

std::string_view stage_name(Stage s) {
  switch (s) {
    case Stage::forward:
      return "forward";
    case Stage::train:
      return "train";
    case Stage::sharded:
      return "sharded";
    case Stage::lowered:
      return "lowered";
    case Stage::scheduled:
      return "scheduled";
  }
  return "?";
}

const std::vector<Stage>& stages() {
  static const std::vector<Stage> s{Stage::forward, Stage::train, Stage::sharded, Stage::lowered,
                                    Stage::scheduled};
  return s;
}

Stage parse_stage(std::string_view name) {
  std::string known;
  for (Stage s : stages()) {
    if (stage_name(s) == name) return s;
    known += (known.empty() ? "" : " | ") + std::string(stage_name(s));
  }
  throw Error(fmt::format("unknown stage '{}'", name), "one of: " + known);
}

const std::vector<Pass>& pipeline() {
  static const std::vector<Pass> p{build_model_pass(),     pipeline_micro_batches_pass(),
                                   differentiate_pass(),   recast_pass(),
                                   add_optimizer_pass(),   apply_tactics_pass(),
                                   propagate_pass(),       lower_pass(),
                                   reshard_pass(),         recompute_pass(),
                                   pipeline_stages_pass(), dce_pass(),
                                   gather_cast_pass(),     reduce_cast_pass(),
                                   bucket_pass(),          synthesize_pass(),
                                   prefetch_pass(),        micro_batch_pass()};
  return p;
}

const char* reduce_dtype_name(DType t) { return t == DType::bf16 ? "bf16" : "f32"; }

const char* bucket_name(ScheduleOptions::Bucket b) {
  switch (b) {
    case ScheduleOptions::Bucket::block:
      return "block";
    case ScheduleOptions::Bucket::automatic:
      return "auto";
    case ScheduleOptions::Bucket::none:
      break;
  }
  return "none";
}

const char* recompute_name(ScheduleOptions::Recompute r) {
  switch (r) {
    case ScheduleOptions::Recompute::selective:
      return "selective";
    case ScheduleOptions::Recompute::selective_op:
      return "selective_op";
    case ScheduleOptions::Recompute::full:
      return "full";
    case ScheduleOptions::Recompute::none:
      break;
  }
  return "none";
}

const Pass& find_pass(std::string_view name) {
  std::string known;
  for (const Pass& p : pipeline()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error(fmt::format("unknown pass '{}'", name), "one of: " + known);
}

namespace {

// Everything a pass may change, as text: the global graph, the tactics' and propagation's
// shardings, the rank program.
std::string compilation_text(const Compilation& c) {
  std::string t = ir::print(c.model.graph);
  for (const auto& [v, a] : c.annotations)
    t += fmt::format("{} {} {}\n", v, shard::to_string(a.sharding),
                     a.has_use ? shard::to_string(a.use) : "");
  for (const shard::Sharding& s : c.propagation.value) t += shard::to_string(s) + "\n";
  t += ir::print(c.rank.graph);
  return t;
}

void run_one(const Pass& p, Compilation& c, const Options& opts) {
  const std::string before = opts.report_changes ? compilation_text(c) : "";
  p.run(c, opts);
  c.passes_run.push_back({p.name, !opts.report_changes || compilation_text(c) != before});
  auto diags = verify(c, opts, p.stage);
  if (diags.empty()) return;
  std::string msg = fmt::format("{}: pass '{}' left an invalid {} program:", opts.source, p.name,
                                stage_name(p.stage));
  for (const auto& d : diags) msg += "\n  " + d;
  throw Error(msg);
}

}  // namespace

Compilation compile(const Options& opts, Stage until) {
  Compilation c;
  for (const Pass& p : pipeline())
    if (p.stage <= until) run_one(p, c, opts);
  return c;
}

void compile_on(Compilation& c, const Options& opts, Stage after, Stage until) {
  for (const Pass& p : pipeline())
    if (p.stage > after && p.stage <= until) run_one(p, c, opts);
}

void run_passes(Compilation& c, const Options& opts, const std::vector<std::string>& names) {
  for (const auto& n : names) run_one(find_pass(n), c, opts);
}

}  // namespace loom::passes
