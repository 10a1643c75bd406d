#include "loom/core/suggest.h"

#include <algorithm>

namespace loom {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::optional<std::string> nearest(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  size_t bd = 3;
  for (const auto& k : known) {
    size_t d = edit_distance(word, k);
    if (d < bd) bd = d, best = k;
  }
  if (best.empty()) return std::nullopt;
  return best;
}

std::string suggest(const std::string& word, const std::vector<std::string>& known) {
  if (auto best = nearest(word, known)) return "did you mean '" + *best + "'?";
  std::string all;
  for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
  return "known keys: " + all;
}

}  // namespace loom
