// A sharded Hugging Face checkpoint's model.safetensors.index.json (`[model] init = DIR`): the
// index read and its shards opened. Beside it lies one valid shard,
// model-00001-of-00002.safetensors (tensors "a" and "b"), so an index can name real files, missing
// ones and wrong tensors.
#include <filesystem>

#include "fuzz/fuzz.h"
#include "loom/core/safetensors.h"
#include "loom/train/hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool shard = [] {
    const float v[4] = {1, 2, 3, 4};
    std::filesystem::create_directories(loom::fuzz::scratch_dir() + "/hfi");
    loom::write_safetensors(loom::fuzz::scratch_dir() + "/hfi/model-00001-of-00002.safetensors",
                            {{"a", loom::DType::f32, {2}, v}, {"b", loom::DType::f32, {2}, v + 2}},
                            {});
    return true;
  }();
  (void)shard;
  loom::fuzz::put_file("hfi/model.safetensors.index.json", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const auto w = loom::train::Weights::open(loom::fuzz::scratch_dir() + "/hfi");
    for (const std::string& name : w.names()) (void)w.get(name);
  });
  return 0;
}
