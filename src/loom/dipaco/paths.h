// DiPaCo's modules and paths (Douillard et al. 2024, arXiv 2403.10616): the model's layers fall
// into L levels, and each level into K_l interchangeable modules; a path takes one module at every
// level, so there are K_0 x ... x K_{L-1} paths, each a whole model of the base model's size.
// Islands train paths; the outer server keeps every module once (the module table) and averages
// each module's outer gradient over the paths through it that pushed in the round.
//
// Levels: the transformer blocks (a tensor's layer: Tensor::layer, as the model declares it) are
// cut into L contiguous runs of about equal length, block b of n in level floor(b L / n); the
// tensors before the first block (the embeddings) belong to level 0, those after the last (the
// final norm, the head) to level L - 1. A function of the tensors' layers and the module counts
// alone, so the server and every island compute the same layout.
//
// Path p's module at level l is the l-th digit of p in the mixed radix (K_0, ..., K_{L-1}), the
// last level's digit varying fastest: with modules = [2, 2], path 3 = modules (1, 1), written
// "1.1".
//
// The module table's tensors are "l<l>m<m>/<name>" (level, module, the model's tensor name), level
// by level, module by module, each module's tensors in the model's order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/dipaco/config_section.h"
#include "loom/train/tensor_list.h"

namespace loom::dipaco {

using train::TensorList;

struct Paths {
  std::vector<int64_t> modules;  // K_l per level
  TensorList table;              // the module table's names and shapes (no data)
  // path -> for each tensor of the model, in its order, that tensor's index in `table`
  std::vector<std::vector<size_t>> path;
  std::vector<int64_t> level;  // the model's tensor -> its level

  size_t count() const { return path.size(); }
  std::vector<int64_t> digits(size_t p) const;  // p's module at each level
  std::string name(size_t p) const;             // "1.0.3": the digits
};

// The layout of `model` (its tensors' names and shapes, in order) with `modules` per level. Throws
// loom::Error when there are no levels, a level has no module, there are more levels than blocks,
// or more than kMaxPaths paths.
Paths layout(const TensorList& model, const std::vector<int64_t>& modules);

// The module table with every module of a level holding `model`'s tensors of that level (all
// paths start as the same model).
TensorList module_table(const Paths& paths, const TensorList& model);

// Path p's tensors of `table`, under the model's names (copies), in the model's order.
TensorList path_view(const Paths& paths, size_t p, const TensorList& table,
                     const TensorList& model_spec);

}  // namespace loom::dipaco
