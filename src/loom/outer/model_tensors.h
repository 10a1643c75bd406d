// A model's parameters as the outer sync service's tensors: names, shapes, each one's layer from
// the parameter groups the model declares (models::ParamInfo::block: "layers.3" is a repeated
// layer, "embed" and "head" are not; ordinals in forward order), and optionally the values.
#pragma once

#include "loom/outer/tensors.h"
#include "loom/train/params.h"

namespace loom::outer {

// with_data: the parameters' values too; else empty data (a spec).
TensorList model_tensors(train::ParamStore& params, bool with_data);

}  // namespace loom::outer
