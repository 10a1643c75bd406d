#include "loom/dipaco/documents.h"

#include <algorithm>

namespace loom::dipaco {

// Each document's first `n` tokens (fewer if it is shorter).
std::vector<std::vector<int32_t>> heads(const data::TextCorpus& c, data::TextCorpus::Split s,
                                        const std::vector<int64_t>& starts, int64_t n) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t st : starts) {
    const int64_t k = std::min(n, c.size(s) - st);
    out.emplace_back(size_t(k));
    c.read(s, st, k, out.back().data());
  }
  return out;
}

// The held-out documents among a split's: every `every`-th (none when every is 0).
bool held_out(size_t i, int64_t every) {
  return every > 0 && int64_t(i % size_t(every)) == every - 1;
}

}  // namespace loom::dipaco
