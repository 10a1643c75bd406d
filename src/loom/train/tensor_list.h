// A model's tensors on the host as named lists, with the block each belongs to: what islands
// exchange with the outer server (outer/tensors.h moves them on the wire), and what streaming
// fragments (outer/fragments.h) and DiPaCo's module table (dipaco/paths.h) split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // product(shape) elements; empty in a spec
  // Its transformer block's ordinal among the model's repeated layers, in forward order (the
  // model's declared parameter groups: ir::Roles::blocks, models::ParamInfo::block); -1 for the
  // embeddings, the final norm and the head. What streaming fragments and DiPaCo's levels split by.
  int64_t layer = -1;
};
using TensorList = std::vector<Tensor>;

// Tensors of the same names and shapes, zero-filled (`t` may be a spec without data).
TensorList zeros_like(const TensorList& t);
int64_t total_elements(const TensorList& t);

// The tensors of `all` at `which` (copies), in that order; and the inverse, which writes `part`'s
// data back to them.
TensorList gather(const TensorList& all, const std::vector<size_t>& which);
void scatter(const TensorList& part, const std::vector<size_t>& which, TensorList& all);

}  // namespace loom::train
