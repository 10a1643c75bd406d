// The safetensors reader: weights, checkpoints, loom export's output and the outer server's state.
#include "loom/core/safetensors.h"

#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      loom::fuzz::put_file("model.safetensors", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const auto f = loom::SafetensorsFile::open(path);
    // every tensor's bytes are readable as its dtype (the sanitizers check the bounds)
    uint64_t sum = 0;
    for (const auto& name : f.names()) {
      const auto& t = f.get(name);
      const auto* b = static_cast<const uint8_t*>(t.data);
      for (size_t i = 0; i < t.nbytes; ++i) sum += b[i];
    }
    for (const auto& [k, v] : f.metadata()) sum += k.size() + v.size();
    if (sum == uint64_t(-1)) std::abort();  // keeps the loop
  });
  return 0;
}
