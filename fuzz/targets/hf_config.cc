// A Hugging Face model directory's config.json (`[model] init = DIR`, `loom sample --model DIR`),
// read into a [model].
#include "fuzz/fuzz.h"
#include "loom/train/hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::put_file("hf/config.json", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] { (void)loom::train::read_hf_model(loom::fuzz::scratch_dir() + "/hf"); });
  return 0;
}
