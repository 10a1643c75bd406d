// The token shard reader: what `loom train` reads its data from. Shard::open reads and checks every
// token; the target then reads single tokens at both ends, as a sampler does, and holds them to the
// reader's promise (inside the vocabulary).
#include "fuzz/fuzz.h"
#include "loom/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("train.tok", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const auto s = loom::data::Shard::open(path);
    if (s.size() == 0) return;
    for (int64_t i : {int64_t(0), s.size() - 1})
      if (s[i] < 0 || s[i] >= s.vocab_size()) std::abort();
  });
  return 0;
}
