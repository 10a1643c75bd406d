// Streaming DiLoCo's fragments (Douillard et al. 2025, arXiv 2501.18512): the model's tensors fall
// into F fragments, each synced on its own schedule, so a sync moves about 1/F of the model.
//
// The split is a function of the tensors (their layers and shapes) and F alone, so the server and
// every island compute the same one. Transformer blocks go round-robin by layer ("strided":
// fragment p holds layers p, p + F, p + 2F, ...; a tensor's layer is its block's ordinal as the
// model declares it: Tensor::layer, model_tensors()); every other tensor (embeddings, final norm,
// head) goes to the fragment holding the fewest elements at that point, so the largest sync stays
// near 1/F of the model. With F = 1 there is one fragment: the whole model, in its order.
//
// The schedule (island.h): one fragment is pushed every H/F inner steps, in cyclic order, so each
// is pushed every H steps, fragment p first at step (p + 1) H / F (as torchft's streaming DiLoCo
// staggers them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/outer/tensors.h"

namespace loom::outer {

// fragment -> the indices (into `spec`) of its tensors, in increasing order. Throws loom::Error
// when F < 1, or when F exceeds what the model can fill (a fragment would be empty).
using Fragments = std::vector<std::vector<size_t>>;
Fragments split_fragments(const TensorList& spec, int64_t f);

// The fragment's tensors of `all` (copies), in its order; and the inverse (train/tensor_list.h).
using train::gather;
using train::scatter;

}  // namespace loom::outer
