// The compile pipeline's vocabulary: the stages a training step goes through, the Compilation that
// carries it from stage to stage, and the Pass, one named transformation of it.
//
//   forward   the model's graph and its loss (models/)
//   train     + gradients, clipping and AdamW: the global training step (autodiff/)
//   sharded   + a Sharding for every value under the plan (shard/ tactics and propagation)
//   lowered   + the per-rank program: local shapes and collectives (shard/lower)
//   scheduled the per-rank program after the passes that bucket and reorder its collectives
//             ([passes]: ScheduleOptions)
//
// A pass reads the Options (what to compile) and the Compilation so far and extends it; it never
// reaches into another pass's state. The pipeline (pipeline.h) runs the verifier after every pass.
//
// Invariant: value ids in `model` and the handles are ids of `model.graph`; `rank.local` maps them
// into `rank.graph`. A pass before `scheduled` only appends to a graph (ids never change), so
// earlier handles stay valid; a scheduled-stage pass rebuilds `rank` (passes/rewrite.h), keeping
// `rank.local` and `rank.outputs` pointing at the same computations.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/autodiff/autodiff.h"
#include "loom/models/model.h"
#include "loom/shard/lower.h"
#include "loom/sim/cluster.h"

namespace loom::passes {

enum class Stage { forward, train, sharded, lowered, scheduled };
std::string_view stage_name(Stage s);
const std::vector<Stage>& stages();  // in pipeline order
// Throws loom::Error listing the stages for an unknown name.
Stage parse_stage(std::string_view name);

// What the step computes, which decides the graph's outputs:
//   eval    loss                     (validation)
//   infer   loss, logits             (sampling)
//   grads   loss, logits, gradients  (loom step, tests)
//   train   loss, grad_norm and the AdamW update; with `accumulate`, of the mean of the micro-
//           batches' gradients (Accumulation below)
//   decode  one step of incremental decoding (models::build_decode): seq_len new tokens at a
//           runtime position, key/value caches of cache_len positions, the last token's logits
//           (inference only: it stops at the forward stage and takes no plan)
enum class StepKind { eval, infer, grads, train, decode };

// [passes]: what the scheduled stage does to a per-rank program, in the order its passes run.
//   reshard_after_forward   true: a split parameter is gathered again for each later reader, so
//              the backward gathers again (passes/reshard.cc); false: gathered once per step (as
//              lowered) and kept to its last use
//   cast_before_gather   true: a parameter whose gathered copy is only cast (bf16 compute) is
//              cast before its all-gather and gathered in the narrower dtype
//              (passes/gather_cast.cc)
//   recast     true: under bf16 each weight's cast is made again for the backward instead of kept
//              from the forward across the loss (passes/recast.cc): one more pass over the weights
//              for the whole model's bf16 copy less in memory; false keeps the forward's copies
//              (as PyTorch's autocast cache does)
//   recompute  none; selective: norms, activations, rope and casts made again in the backward
//              instead of kept across the loss; selective_op: selective, and every second matmul
//              of each layer too (torchtitan's selective_ac_option = "op"); full: only each
//              layer's inputs kept, the rest of the layer made again (passes/recompute.cc)
//   bucket     none: every collective as lowered; block: a parameter's all-gathers and a
//              gradient's reductions merged into one collective per parameter group (roles.blocks:
//              a transformer block, the embedding, the head) and direction, up to bucket_mb each
//              (SimpleFSDP's manual wrapping); auto: the bucketing the simulator predicts fastest
//              on `cluster` (passes/bucket.cc)
//   reduce_dtype   f32 (the default, exact) or bf16: each gradient's reduction (reduce_scatter,
//              all_reduce) runs in that dtype, cast before it and back to f32 after, half the
//              bytes on the wire (FSDP2's MixedPrecisionPolicy(reduce_dtype);
//              passes/reduce_cast.cc)
//   activation_reduce_dtype   f32 (the default, exact) or bf16: tensor parallelism's reductions
//              of partial matmul products (activations and their gradients, not the weights')
//              run in that dtype, as Megatron-LM's in a bf16 model (passes/reduce_cast.cc)
//   prefetch   collectives start early and are waited for late, on each rank's communication
//              threads, the host's and the network's (passes/prefetch.cc); at most max_in_flight
//              units at a time per mesh axis (one parameter group's gathers are one unit, and its
//              gradients' reductions another, however many buckets they take)
struct ScheduleOptions {
  enum class Bucket { none, block, automatic };  // "none", "block", "auto"
  Bucket bucket = Bucket::block;
  double bucket_mb = 64;
  bool reshard_after_forward = true;
  bool cast_before_gather = true;
  DType reduce_dtype = DType::f32;
  DType activation_reduce_dtype = DType::f32;
  bool recast = true;
  enum class Recompute { none, selective, selective_op, full };
  Recompute recompute = Recompute::none;
  bool prefetch = true;
  int64_t max_in_flight = 2;
  // P²: each all_reduce (or chain of them over several axes) becomes the fastest program of
  // sub-group collectives the simulator finds for it on `cluster` (passes/synthesize.cc)
  bool synthesize = false;
  // bucket = "auto" and synthesize: the cluster whose cost model decides ([passes] cluster, loaded
  // with the config; sim/cluster.h)
  std::string cluster_file = "clusters/local.toml";
  std::shared_ptr<const sim::Cluster> cluster;
};
const char* bucket_name(ScheduleOptions::Bucket b);  // "none", "block", "auto"
const char* reduce_dtype_name(DType t);              // "f32", "bf16"
// "none", "selective", "selective_op", "full"
const char* recompute_name(ScheduleOptions::Recompute r);

struct Options {
  models::ModelConfig model;
  int64_t batch = 1, seq_len = 1;  // the global batch (B, T)
  int64_t cache_len = 0;           // decode: positions of the key/value caches
  StepKind kind = StepKind::train;
  bool accumulate = false;  // train: micro-batches' gradients summed in the graph (Accumulation)
  autodiff::AdamWConfig optim;
  shard::Plan plan;                // empty: one rank, every value whole
  int64_t ranks = 1;               // the number of ranks the plan must fit
  std::string source = "<model>";  // for messages: the config file
  ScheduleOptions schedule;        // the scheduled stage's passes
  // Under a pipeline tactic: the coordinate on its axis of the rank compiling, the stage whose
  // program the rank runs (the lowered program is every stage's; pipeline_stages cuts it).
  int64_t pipe_coord = 0;
  // Record whether each pass changed the compilation (PassRun::changed): a text of the graphs and
  // shardings before and after, so off unless asked (`loom inspect CONFIG --passes`).
  bool report_changes = false;
};

// Gradient accumulation (Options::accumulate, [train] grad_accum = k): one training graph serves
// every micro-batch of a step. add_optimizer adds, per parameter P with gradient %d.P,
//
//   state %grad_sum.P : f32[...]           the gradients of the step's earlier micro-batches
//   input %accum.keep : f32[]              1, and 0 on the step's last micro-batch
//   input %accum.scale : f32[]             1/k
//   %grad_sum.P.add = add(%grad_sum.P, %d.P)
//   %grad_sum.P.kept = mul_scalar(%grad_sum.P.add, %accum.keep)
//   %grad_sum.P.assign = assign(%grad_sum.P, %grad_sum.P.kept)
//   %grad_mean.P = mul_scalar(%grad_sum.P.add, %accum.scale)     what clipping and AdamW read
//
// apply_tactics keeps each sum as the tactics keep its mean (an fsdp or zero2 rank: its block), and
// the last scheduled pass (micro_batch) orders the rank program so that its first
// `micro_nodes` nodes are a micro-batch before the last: the forward, the backward, the gradients'
// reductions and the sums' update, nothing of the optimizer. A step runs that prefix k - 1 times
// and the whole program once. A sum is a partial sum over the batch axes that do not split its
// mean (apply_tactics): data parallelism's gradients are reduced once a step, fsdp's on every
// micro-batch into their blocks.
struct Accumulation {
  std::map<int, int> sums;   // global param -> its %grad_sum state
  std::map<int, int> means;  // global param -> its %grad_mean (the optimizer's gradient)
  int keep = -1, scale = -1;
  int64_t micro_nodes = 0;  // scheduled: the rank program's prefix that is one micro-batch
};

// Pipeline parallelism (a [plan] pipeline tactic): the global graph is one step of m micro-batches,
// the model's forward built once per micro-batch over the same parameters (pipeline_micro_batches)
// and differentiated as one graph, so each parameter's gradient is the sum of the micro-batches'
// and its reduction over other axes happens once a step. What the passes after need to cut the
// rank program into stages and order it by the schedule (pipeline_stages):
struct Pipelining {
  std::string axis, schedule;  // the tactic's
  // ranks on the axis (p), micro-batches per step (m), model chunks per rank (v: 1, or more
  // under the interleaved schedule); chunk c of the p * v runs on rank c % p
  int64_t stages = 1, microbatches = 1, virtual_stages = 1;
  // per micro-batch k: its batch inputs, in roles.batch_inputs' order (micro-batch 0's first);
  // each holds rows [k * b, (k + 1) * b) of the step's batch
  std::vector<std::vector<int>> inputs;
  int64_t forward_nodes = 0;   // global nodes [0, forward_nodes) are the forward
  int64_t backward_nodes = 0;  // [forward_nodes, backward_nodes): autodiff's; the rest after
  std::vector<int> origin;     // global node -> the forward node it differentiates, or -1
  std::map<int, int64_t> param_chunk;       // global parameter -> its model chunk
  std::vector<std::string> group_of_chunk;  // per chunk: its parameter groups, "layers.0-layers.3"

  int64_t chunks() const { return stages * virtual_stages; }
  int64_t stage_of_chunk(int64_t chunk) const { return chunk < 0 ? -1 : chunk % stages; }
  int64_t param_stage(int param) const { return stage_of_chunk(param_chunk.at(param)); }
  // rank s's chunks' groups: "layers.0-layers.1, layers.4-layers.5"
  std::string groups_of_stage(int64_t s) const;
};

struct PassRun {
  std::string name;
  bool changed = true;  // as far as Options::report_changes measured; true when not measured
};

// A training step on its way through the pipeline.
struct Compilation {
  models::ModelGraph model;        // the global graph, its handles and roles (forward on)
  std::map<int, int> grads;        // param -> gradient value (train: kinds grads and train)
  autodiff::TrainStep optimizer;   // clipping and AdamW handles (train)
  shard::Annotations annotations;  // the tactics' shardings (sharded)
  shard::Propagation propagation;  // every value's sharding (sharded)
  shard::Program rank;             // the per-rank program (lowered)
  std::optional<Accumulation> accumulation;  // train with Options::accumulate
  std::optional<Pipelining> pipelining;      // under a pipeline tactic
  std::vector<PassRun> passes_run;           // in order
};

struct Pass {
  std::string name;     // snake_case, as --passes and IR-text headers spell it
  std::string summary;  // one line
  Stage stage;  // the stage this pass builds (it runs when compiling to this stage or later)
  std::function<void(Compilation&, const Options&)> run;
};

}  // namespace loom::passes
