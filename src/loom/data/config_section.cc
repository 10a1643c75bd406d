#include "loom/data/config_section.h"

#include "loom/config/schema.h"

namespace loom::data {

const config::Section<DataConfig>& data_section() {
  static const config::Section<DataConfig> s{
      "data",
      {config::string_key("path", &DataConfig::path,
                          "a text file, a directory of `.txt` files, or a `loom data prepare` "
                          "directory")},
      nullptr};
  return s;
}

}  // namespace loom::data
