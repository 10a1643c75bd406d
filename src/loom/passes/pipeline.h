// The compile pipeline: one list of passes, in order, that every place building a training step
// asks for the stage it needs (training, evaluation, inspect, bench, the parity tests). After every
// pass the verifier checks what that pass's stage holds (verify.h); a failure names the pass.
//
// Not here: what a pass does (one file per pass, named after it), running a program (runtime/).
#pragma once

#include <string>
#include <vector>

#include "loom/passes/pass.h"

namespace loom::passes {

// Every pass, in pipeline order (`loom inspect --passes` prints it).
const std::vector<Pass>& pipeline();
// The pass of this name; throws loom::Error listing them for an unknown one.
const Pass& find_pass(std::string_view name);

// Runs the pipeline's passes up to and including the last pass of `until`. Stages past `train`
// shard by Options::plan; an empty plan is one rank: every value whole, no collective, so its
// lowered program is the global graph's and one process gets the scheduled stage's passes too.
// Throws loom::Error: a bad config or plan (naming the key, tactic or value), or a pass that left
// an invalid program (naming the pass and the offending node or value).
Compilation compile(const Options& opts, Stage until);
// Runs the passes of the stages after `after` up to `until` on `c`, a compilation up to `after`
// under the same options but the plan: plan search compiles the training graph once and shards it
// under each candidate plan from there.
void compile_on(Compilation& c, const Options& opts, Stage after, Stage until);

// Runs the named passes, in the order given, on `c` (an IR-text test's parsed graph and roles),
// with the verifier after each.
void run_passes(Compilation& c, const Options& opts, const std::vector<std::string>& names);

// The passes themselves (one file each).
Pass build_model_pass();
// pipeline_micro_batches (stage forward, after build_model): under a pipeline tactic with m
// micro-batches, the model built for B/m rows (build_model asks micro_batch_rows) is copied m - 1
// times over new batch inputs and the same parameters; the loss is the micro-batches' mean, as
// gradient accumulation's (Pipelining above).
Pass pipeline_micro_batches_pass();
// The rows the forward graph is built for: B, or B/m under a pipeline tactic of m micro-batches
// (throws loom::Error naming the keys when m does not divide B, or the step kind has no pipeline).
int64_t micro_batch_rows(const Options& o);
Pass differentiate_pass();
Pass recast_pass();
Pass add_optimizer_pass();
Pass apply_tactics_pass();
Pass propagate_pass();
Pass lower_pass();
Pass reshard_pass();
Pass recompute_pass();
Pass dce_pass();
Pass gather_cast_pass();
Pass reduce_cast_pass();
Pass bucket_pass();
Pass synthesize_pass();
Pass prefetch_pass();
Pass micro_batch_pass();
// pipeline_stages (stage scheduled, first): the lowered program becomes this rank's stage's
// (Options::pipe_coord): its nodes, send and recv where a value crosses stages, in the
// schedule's order over the micro-batches (gpipe: every forward, then every backward; 1f1b).
Pass pipeline_stages_pass();

}  // namespace loom::passes
