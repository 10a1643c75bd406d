// The TOML config loader: `loom train CONFIG` and every command that reads a config.
#include "loom/train/config.h"

#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("config.toml", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] { loom::train::load_config(path); });
  return 0;
}
