#include "loom/train/compile.h"

#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/ops/verify.h"

namespace loom::train {

namespace {

// What a plan cannot be combined with yet.
void require_plannable(const Config& cfg) {
  if (cfg.train.grad_accum > 1)
    throw Error(
        fmt::format("{}: [train] grad_accum > 1 with a [plan] is not supported yet", cfg.path),
        "raise [train] batch_size instead: the plan splits it across ranks");
}

// The accumulate graph (compile.h) of every gradient of s.
void build_accumulate(CompiledStep& s) {
  ir::Graph& a = s.accum_graph;
  ops::Builder b(a);
  s.accum_coef = a.add_input("coef", {DType::f32, {}}, ir::ValueKind::input);
  for (auto [p, d] : s.c.grads) {
    const ir::Value& pv = s.graph().value(p);
    const int sum = a.add_input("sum." + pv.name, pv.type, ir::ValueKind::state);
    const int grad = a.add_input("grad." + pv.name, pv.type, ir::ValueKind::input);
    const int added = b.add(sum, grad, "sum." + pv.name + ".add");
    const int mean =
        b.emit1(ir::Op::mul_scalar, {added, s.accum_coef}, {}, "sum." + pv.name + ".new");
    b.emit1(ir::Op::assign, {sum, mean}, {}, "sum." + pv.name + ".assign");
    s.accum_sum[p] = sum;
    s.accum_grad[p] = grad;
  }
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
  o.ranks = ranks;
  o.source = cfg.path;
  o.schedule = cfg.passes;
  return o;
}

void check_plan(const Config& cfg) {
  require_plannable(cfg);
  passes::compile(step_options(cfg, passes::StepKind::train, cfg.plan.plan.mesh.size()),
                  passes::Stage::scheduled);
}

CompiledStep compile_step(const Config& cfg, passes::StepKind kind, bool with_plan, int64_t ranks) {
  CompiledStep s;
  s.kind = kind;
  s.sharded = with_plan && !cfg.plan.plan.empty();
  if (s.sharded && kind == passes::StepKind::train) require_plannable(cfg);
  const passes::Options opts = step_options(cfg, kind, s.sharded ? ranks : 0);
  // every run goes the whole way: one process lowers the empty plan (one rank, every value whole,
  // no collective) and its program gets the scheduled stage's passes as a rank's does
  s.c = passes::compile(opts, passes::Stage::scheduled);
  if (!opts.accumulate) return s;
  s.accum = cfg.train.grad_accum;
  const ir::Graph& g = s.graph();
  std::map<int, int> grads;  // optimizer-graph param -> its gradient input
  for (auto [p, d] : s.c.grads) {
    const ir::Value& pv = g.value(p);
    int op = s.opt_graph.add_input(pv.name, pv.type, ir::ValueKind::param);
    s.opt_grad_input[p] = grads[op] =
        s.opt_graph.add_input("grad." + pv.name, pv.type, ir::ValueKind::input);
  }
  s.opt = autodiff::add_optimizer(s.opt_graph, grads, cfg.optim);
  s.opt_graph.add_output(s.opt.grad_norm);
  ops::verify_or_throw(s.opt_graph, "optimizer graph for " + cfg.path);
  build_accumulate(s);
  ops::verify_or_throw(s.accum_graph, "accumulate graph for " + cfg.path);
  return s;
}

}  // namespace loom::train
