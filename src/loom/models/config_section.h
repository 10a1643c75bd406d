// [model]: the model's keys (ModelConfig, model.h), with the inline table `moe = { ... }`.
#pragma once

#include "loom/config/fwd.h"
#include "loom/models/model.h"

namespace loom::models {

const config::Section<ModelConfig>& model_section();

}  // namespace loom::models
