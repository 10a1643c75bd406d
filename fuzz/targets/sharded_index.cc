// A sharded checkpoint's index.json (train/sharded_checkpoint.h: resume, loom sample, loom export
// and [model] init read it): the index checked against the rank files and every tensor of both
// parts assembled. Beside it lie two valid rank files of a {data = 2} mesh: rank 0 holds w's first
// half [2], b [2] whole and adam.m.w's first half; rank 1 the second halves. So an index can name
// real blocks, missing ranks, wrong shapes and shardings.
#include <filesystem>

#include "fuzz/fuzz.h"
#include "loom/core/safetensors.h"
#include "loom/train/hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool files = [] {
    const float v[6] = {1, 2, 3, 4, 5, 6};
    const std::string d = loom::fuzz::scratch_dir() + "/sharded";
    std::filesystem::create_directories(d);
    loom::write_safetensors(d + "/rank-00000.safetensors",
                            {{"w", loom::DType::f32, {2}, v},
                             {"b", loom::DType::f32, {2}, v + 4},
                             {"adam.m.w", loom::DType::f32, {2}, v}});
    loom::write_safetensors(
        d + "/rank-00001.safetensors",
        {{"w", loom::DType::f32, {2}, v + 2}, {"adam.m.w", loom::DType::f32, {2}, v + 2}});
    return true;
  }();
  (void)files;
  loom::fuzz::put_file("sharded/index.json", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    for (const char* part : {"model", "optimizer"}) {
      const auto w = loom::train::Weights::sharded(loom::fuzz::scratch_dir() + "/sharded", part);
      for (const std::string& name : w.names()) (void)w.get(name);
    }
  });
  return 0;
}
