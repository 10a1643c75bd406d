#include "loom/passes/config_section.h"

#include "loom/config/schema.h"
#include "loom/sim/cluster.h"

namespace loom::passes {

const config::Section<ScheduleOptions>& passes_section() {
  using namespace config;
  using O = ScheduleOptions;
  using Bucket = O::Bucket;
  using Recompute = O::Recompute;
  static const Section<O> s{
      "passes",
      {
          bool_key("reshard_after_forward", &O::reshard_after_forward,
                   "false: each parameter gathered once per step"),
          bool_key("cast_before_gather", &O::cast_before_gather,
                   "bf16: weights cast before their all-gather"),
          enum_key("reduce_dtype", &O::reduce_dtype, {DType::f32, DType::bf16}, reduce_dtype_name,
                   "the dtype gradients are reduced in (`bf16`: half the bytes)"),
          enum_key("activation_reduce_dtype", &O::activation_reduce_dtype,
                   {DType::f32, DType::bf16}, reduce_dtype_name,
                   "the dtype tensor parallelism reduces partial matmul products in (activations "
                   "and their gradients; `bf16`: half the bytes, as Megatron-LM)"),
          bool_key("recast", &O::recast,
                   "bf16: weights cast again for the backward (false: the forward's cast kept)"),
          enum_key(
              "recompute", &O::recompute,
              {Recompute::none, Recompute::selective, Recompute::selective_op, Recompute::full},
              recompute_name, "activation checkpointing (`selective_op`: torchtitan's)"),
          enum_key("bucket", &O::bucket, {Bucket::none, Bucket::block, Bucket::automatic},
                   bucket_name, "`auto`: sized by the simulator on `cluster`"),
          float_key("bucket_mb", &O::bucket_mb, {0, 1e6, true, false}, "", config::Used::f64),
          string_key("cluster", &O::cluster_file,
                     "the cluster file `bucket = \"auto\"` and `synthesize` predict on"),
          bool_key("prefetch", &O::prefetch,
                   "collectives on a communication thread, started early"),
          int_key("max_in_flight", &O::max_in_flight, at_least(1),
                  "prefetched units at once per mesh axis (a parameter group's gathers, or its "
                  "gradients' reductions, count as one)"),
          bool_key("synthesize", &O::synthesize,
                   "P2: all-reduces as the fastest hierarchical program on `cluster`"),
      },
      [](O& o, const Fail& fail) {
        if (o.bucket != Bucket::automatic && !o.synthesize) return;
        try {
          o.cluster = std::make_shared<const sim::Cluster>(sim::load_cluster(o.cluster_file));
        } catch (const Error& e) {
          fail("[passes] cluster", std::string(o.synthesize ? "synthesize" : "bucket = \"auto\"") +
                                       " needs it: " + e.what());
        }
      }};
  return s;
}

}  // namespace loom::passes
