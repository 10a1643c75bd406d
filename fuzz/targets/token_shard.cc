// The token shard reader: what `loom train` reads its data from.
#include <vector>

#include "fuzz/fuzz.h"
#include "loom/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("train.tok", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const auto s = loom::data::Shard::open(path);
    // read it all, in windows as the loader does, and a few single tokens at the edges
    std::vector<int32_t> buf(4096);
    for (int64_t at = 0; at < s.size(); at += int64_t(buf.size())) {
      const int64_t n = std::min<int64_t>(int64_t(buf.size()), s.size() - at);
      s.read(at, n, buf.data());
      for (int64_t i = 0; i < n; ++i)
        if (buf[size_t(i)] < 0 || buf[size_t(i)] >= s.vocab_size()) std::abort();
    }
    if (s.size() > 0 && (s[0] >= s.vocab_size() || s[s.size() - 1] >= s.vocab_size())) std::abort();
  });
  return 0;
}
