// megatron: Megatron-LM tensor parallelism. The weights the model declares column-parallel
// (Llama's q/k/v and gate/up, GPT-2's c_attn and c_fc) split by output features, the row-parallel
// ones (o/down, c_proj) by input features (ir/roles.h); their gradients and moments alike.
// Propagation makes the activations between a column- and a row-parallel GEMM split by feature,
// and the row-parallel output a partial sum that lowering all-reduces.
//
// Vocabulary-parallel too (Megatron-LM's VocabParallelEmbedding and parallel cross-entropy): the
// weights whose dim is the vocabulary (roles.vocab_parallel: the embedding table, the output
// head) split by it where the axis divides it. The embedding's output is a partial sum (each rank
// looks up the ids in its block), the logits stay split by vocabulary into the loss (each rank's
// softmax statistics gathered, never the logits: ops/loss.cc), and the head's and the table's
// gradients are made split, so no rank all-reduces them whole.
#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

TacticDef megatron_tactic() {
  return {.name = "megatron",
          .summary = "tensor parallel: column-parallel weights by output, row-parallel by input",
          .selects = "roles.column_parallel, roles.row_parallel",
          .not_after = {"fsdp", "zero1", "zero2", "megatron", "pipeline"},
          .apply = [](TacticContext& c, const Tactic&) {
            const ir::Roles& r = c.roles();
            if (r.column_parallel.empty() && r.row_parallel.empty())
              throw Error(
                  fmt::format("{}: this model declares no column- or row-parallel weight", c.by()),
                  "megatron splits the weights a model declares tensor-parallel: Llama's "
                  "q/k/v/o and gate/up/down projections, GPT-2's c_attn, c_proj and MLP");
            for (const auto& w : r.column_parallel) c.split_with_state(w.value, size_t(w.dim));
            for (const auto& w : r.row_parallel) c.split_with_state(w.value, size_t(w.dim));
            for (const auto& w : r.vocab_parallel)
              if (c.divisible_dim(w.value, c.current(w.value)) == int(w.dim))
                c.split_with_state(w.value, size_t(w.dim));
          }};
}

}  // namespace loom::shard
