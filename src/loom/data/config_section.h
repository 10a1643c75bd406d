// [data]: where the training text comes from.
#pragma once

#include <string>

#include "loom/config/fwd.h"

namespace loom::data {

struct DataConfig {
  std::string path;  // a text file, a directory of .txt files, or a `loom data prepare` directory
};

const config::Section<DataConfig>& data_section();

}  // namespace loom::data
