#include "loom/train/compile.h"

#include <algorithm>

#include "loom/ops/verify.h"

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

std::vector<CompiledStep> compile_stages(const Config& cfg, passes::StepKind kind, int64_t ranks) {
  passes::Options opts = step_options(cfg, kind, ranks);
  const passes::Compilation lowered = passes::compile(opts, passes::Stage::lowered);
  std::vector<CompiledStep> stages;
  for (opts.pipe_coord = 0; opts.pipe_coord < pipeline_stages(cfg.plan.plan); ++opts.pipe_coord) {
    CompiledStep s;
    s.kind = kind;
    s.sharded = true;
    s.c = lowered;
    passes::compile_on(s.c, opts, passes::Stage::lowered, passes::Stage::scheduled);
    stages.push_back(std::move(s));
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
