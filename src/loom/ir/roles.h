// Roles: what a model declares about the values of its graph, so that tactics and passes select
// values by what they are (a batch input, a column-parallel weight, one transformer block's
// parameters) and never by their names.
//
// A model fills Roles when it builds its graph (models/); an IR-text test declares them in its
// header (tests/ir_text/). Nothing here says how a value is split: that is a tactic's choice
// (shard/).
//
// Invariant: every id names a value of the graph the Roles came with; ids never change once
// assigned (ir/graph.h), so Roles stay valid while passes append nodes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::ir {

// A weight of a tensor-parallel pair (Megatron-LM): a column-parallel weight is split by its output
// features, a row-parallel one by its input features. `dim` is that features' dim in the weight as
// it is stored (Llama's nn.Linear stores (out, in), GPT-2's Conv1D (in, out)).
struct ParallelWeight {
  int value = -1;
  int64_t dim = 0;
  bool operator==(const ParallelWeight&) const = default;
};

// One group of parameters that is computed together: a transformer block, the embedding, the head.
// The unit that bucketing, recompute and pipeline stages work on.
struct ParamGroup {
  std::string name;         // "embed", "layers.0", ..., "head"
  std::vector<int> params;  // in declaration order
  // A repeated layer (a transformer block): every group but "embed" and "head", which models and
  // IR-text tests name so. recompute = "full" keeps only a layer's input across the loss.
  bool layer() const { return name != "embed" && name != "head"; }
  bool operator==(const ParamGroup&) const = default;
};

struct Roles {
  std::vector<int> batch_inputs;                // inputs whose dim 0 is the batch (tokens, targets)
  std::vector<ParallelWeight> column_parallel;  // split by output features (q/k/v, gate/up, c_fc)
  std::vector<ParallelWeight> row_parallel;     // split by input features (o, down, c_proj)
  // `dim` is the vocabulary: the embedding table, the output head (GPT-2's tied wte is both)
  std::vector<ParallelWeight> vocab_parallel;
  std::vector<ParamGroup> blocks;  // every parameter in exactly one group, forward order
  std::vector<int> experts;        // expert weights (Mixture-of-Experts); empty when dense
};

}  // namespace loom::ir
