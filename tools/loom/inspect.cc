// loom inspect: print a model's graph as IR text at a stage of the compile pipeline (passes/), or
// the pipeline itself (--passes; with a config, whether each pass changed its compilation).
//
//   forward   the model and its loss
//   train     forward, backward, clipping and AdamW: the global training step
//   sharded   the training step with every value's sharding under the config's [plan]
//   lowered   the per-rank program: local shapes and collectives (--rank R picks the rank whose
//             coordinates the header shows; the program itself is the same on every rank), after a
//             header counting each axis's collectives and their bytes per step, and the planned
//             peak (runtime/memory_plan.h: the arena, buffers in flight included, and the bound
//             parameters, moments and inputs)
//   scheduled  the per-rank program after the [passes] (bucket, prefetch), with the same header
#include <fmt/format.h>

#include <map>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/ir/text.h"
#include "loom/passes/pipeline.h"
#include "loom/runtime/memory_plan.h"
#include "loom/sim/simulate.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom::cli {

std::function<int()> add_inspect(CLI::App& app) {
  struct Opts {
    std::string config, stage = "forward";
    int64_t rank = 0;
    std::vector<std::string> sets;
    bool passes = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand("inspect", "print the graph as IR text");
  s->add_option("config", o->config, "config TOML");
  s->add_option("--stage", o->stage, "forward | train | sharded | lowered | scheduled");
  s->add_flag("--passes", o->passes,
              "list the compile pipeline's passes; with a config, whether each changed its step");
  s->add_option("--rank", o->rank, "the rank to show (--stage lowered or scheduled)")
      ->check(whole_number(0, (1 << 24) - 1));
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  return [o]() {
    if (o->passes && !o->config.empty()) {
      train::Config cfg = train::load_config(o->config, o->sets);
      passes::Options opts =
          train::step_options(cfg, passes::StepKind::train, cfg.plan.plan.mesh.size());
      opts.report_changes = true;
      const passes::Compilation c = passes::compile(opts, passes::Stage::scheduled);
      for (const passes::PassRun& r : c.passes_run) {
        const passes::Pass& p = passes::find_pass(r.name);
        fmt::print("{:<8} {:<14} {:<9} {}\n", passes::stage_name(p.stage), p.name,
                   r.changed ? "changed" : "unchanged", p.summary);
      }
      return 0;
    }
    if (o->passes) {
      for (passes::Stage st : passes::stages())
        for (const passes::Pass& p : passes::pipeline())
          if (p.stage == st)
            fmt::print("{:<8} {:<14} {}\n", passes::stage_name(st), p.name, p.summary);
      return 0;
    }
    if (o->config.empty())
      throw Error("loom inspect: a config is required", "loom inspect CONFIG.toml [--stage S]");
    const passes::Stage stage = passes::parse_stage(o->stage);
    train::Config cfg = train::load_config(o->config, o->sets);
    const shard::Plan& plan = cfg.plan.plan;
    if (stage >= passes::Stage::sharded && (o->rank < 0 || o->rank >= plan.mesh.size()))
      throw Error(fmt::format("--rank {}: the mesh {} has ranks 0..{}", o->rank,
                              plan.mesh.to_string(), plan.mesh.size() - 1));
    passes::Options opts = train::step_options(cfg, passes::StepKind::train, plan.mesh.size());
    // a pipeline's stages run different programs: the rank's own
    if (const shard::Tactic* pipe = shard::find_pipeline(plan); pipe && plan.mesh.has(pipe->axis))
      opts.pipe_coord = plan.mesh.coord(o->rank, pipe->axis);
    const passes::Compilation c = passes::compile(opts, stage);
    if (stage <= passes::Stage::train) {
      fmt::print("{}", ir::print(c.model.graph));
      return 0;
    }
    if (stage == passes::Stage::sharded) {
      const shard::Propagation& p = c.propagation;
      fmt::print("# mesh {}: propagation reached {} after {} sweeps\n", plan.mesh.to_string(),
                 p.converged ? "a fixed point" : "its sweep limit", p.sweeps);
      fmt::print("{}", shard::print_sharded(c.model.graph, p));
      return 0;
    }
    std::string coords;
    for (const auto& [axis, n] : plan.mesh.axes())
      coords += fmt::format("{}{} = {}", coords.empty() ? "" : ", ", axis,
                            plan.mesh.coord(o->rank, axis));
    fmt::print("# rank {} of {}: {{{}}}\n", o->rank, plan.mesh.size(), coords);
    if (c.pipelining && stage == passes::Stage::scheduled)
      fmt::print("# pipeline stage {} of {}: {} ({} micro-batches, {})\n", opts.pipe_coord,
                 c.pipelining->stages, c.pipelining->groups_of_stage(opts.pipe_coord),
                 c.pipelining->microbatches, c.pipelining->schedule);
    // what one step moves: per axis and collective, the count and the bytes of the whole buffer
    // (all_gather: what arrives; reduce_scatter, all_reduce, all_to_all: what goes in)
    const ir::Graph& pg = c.rank.graph;
    for (const auto& [axis, ops] : sim::traffic(pg)) {
      std::string line;
      for (const auto& [op, e] : ops)
        line += fmt::format("{}{} x{} ({:.3g} MB)", line.empty() ? "" : ", ", op, e.count,
                            e.bytes / 1e6);
      fmt::print("# axis {}: {}\n", axis, line);
    }
    const runtime::MemoryPlan mp = runtime::plan_memory(pg);
    fmt::print("# planned peak: {:.4g} MB = {:.4g} MB arena + {:.4g} MB bound\n",
               double(mp.arena_bytes + mp.external_bytes) / 1e6, double(mp.arena_bytes) / 1e6,
               double(mp.external_bytes) / 1e6);
    fmt::print("{}", ir::print(pg));
    return 0;
  };
}

}  // namespace loom::cli
