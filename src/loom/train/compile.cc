#include "loom/train/compile.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/ops/verify.h"
#include "loom/passes/pipeline.h"

namespace loom::train {

namespace {

// A pipeline's stages: its axis's size; 1 without one, or when its axis is not in the mesh (the
// compile pipeline then says so).
int64_t pipeline_stages(const shard::Plan& plan) {
  const shard::Tactic* pipe = shard::find_pipeline(plan);
  return pipe && plan.mesh.has(pipe->axis) ? plan.mesh.axis_size(pipe->axis) : 1;
}

}  // namespace

passes::Options step_options(const Config& cfg, passes::StepKind kind, int64_t ranks) {
  passes::Options o;
  o.model = cfg.model;
  o.batch = cfg.train.batch_size;
  o.seq_len = cfg.train.seq_len;
  o.kind = kind;
  o.accumulate = kind == passes::StepKind::train && cfg.train.grad_accum > 1;
  o.optim = cfg.optim;
  if (ranks > 0) o.plan = cfg.plan.plan;
  o.ranks = std::max<int64_t>(ranks, 1);  // no plan: one rank, the empty mesh's
  o.source = cfg.path;
  o.schedule = cfg.passes;
  return o;
}

void check_plan(const Config& cfg) {
  compile_stages(cfg, passes::StepKind::train, cfg.plan.plan.mesh.size());
}

CompiledStep compile_step(const Config& cfg, passes::StepKind kind, bool with_plan, int64_t ranks,
                          int64_t rank) {
  CompiledStep s;
  s.kind = kind;
  s.sharded = with_plan && !cfg.plan.plan.empty();
  passes::Options opts = step_options(cfg, kind, s.sharded ? ranks : 0);
  if (s.sharded && pipeline_stages(cfg.plan.plan) > 1)
    opts.pipe_coord = cfg.plan.plan.mesh.coord(rank, shard::find_pipeline(cfg.plan.plan)->axis);
  // every run goes the whole way: one process lowers the empty plan (one rank, every value whole,
  // no collective) and its program gets the scheduled stage's passes as a rank's does
  s.c = passes::compile(opts, passes::Stage::scheduled);
  if (opts.accumulate) s.accum = cfg.train.grad_accum;
  return s;
}

std::vector<shard::Program> compile_stages(const Config& cfg, passes::StepKind kind,
                                           int64_t ranks) {
  passes::Options opts = step_options(cfg, kind, ranks);
  passes::Compilation shared = passes::compile(opts, passes::Stage::lowered);
  std::vector<std::string> before, after;  // the scheduled stage's passes
  for (const passes::Pass& p : passes::pipeline()) {
    if (p.stage != passes::Stage::scheduled) continue;
    (after.empty() && p.name != "pipeline_stages" ? before : after).push_back(p.name);
  }
  passes::run_passes(shared, opts, before);
  // The passes from pipeline_stages on rewrite the rank program alone (pipeline_stages cuts the
  // stage's part from it), reading the rest: each stage starts from the lowered program on the
  // one compilation, rather than on a copy of the whole (which was most of a 32-stage plan's
  // prediction, and 9.7 GB of memory for Llama 70B's).
  const shard::Program lowered = std::move(shared.rank);
  const size_t ran = shared.passes_run.size();
  const uint64_t global = shared.model.graph.version();
  std::vector<shard::Program> stages;
  const int64_t n = pipeline_stages(cfg.plan.plan);
  for (opts.pipe_coord = 0; opts.pipe_coord < n; ++opts.pipe_coord) {
    shared.rank = lowered;
    shared.passes_run.resize(ran);
    passes::run_passes(shared, opts, after);
    LOOM_CHECK(n == 1 || (shared.model.graph.version() == global && !shared.accumulation))
        << "compile_stages: a pass after pipeline_stages changed more than the rank program";
    stages.push_back(std::move(shared.rank));
  }
  return stages;
}

CompiledStep compile_step(const Config& cfg, const passes::Compilation& trained, int64_t ranks) {
  CompiledStep s;
  s.kind = passes::StepKind::train;
  s.sharded = !cfg.plan.plan.empty();
  const passes::Options opts = step_options(cfg, s.kind, s.sharded ? ranks : 0);
  s.c = trained;
  passes::compile_on(s.c, opts, passes::Stage::train, passes::Stage::scheduled);
  if (opts.accumulate) s.accum = cfg.train.grad_accum;
  return s;
}

}  // namespace loom::train
