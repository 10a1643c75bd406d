#include "loom/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::infer {

int Sampler::next(const float* logits, int n) {
  // Candidates by logit, highest first; ties go to the lower id so the order is fully determined
  // (a strict total order: only the top k need sorting, and greedy needs only the first).
  auto before = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (temperature_ == 0) {
    int best = 0;
    for (int i = 1; i < n; ++i)
      if (before(i, best)) best = i;
    return best;
  }
  const int k = top_k_ > 0 ? int(std::min<int64_t>(top_k_, n)) : n;
  std::vector<int> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  // softmax over the top k of logits / temperature, in double, shifted by the max for range
  std::vector<double> p(static_cast<size_t>(k));
  const double top = double(logits[ids[0]]) / temperature_;
  double sum = 0;
  for (int i = 0; i < k; ++i)
    sum += p[size_t(i)] = std::exp(double(logits[ids[i]]) / temperature_ - top);
  // 53 random bits in [0, 1): unlike std::uniform_real_distribution, the same on every library
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[size_t(i)];
    if (u < acc) return ids[size_t(i)];
  }
  return ids[size_t(k - 1)];  // u within rounding of sum
}

}  // namespace loom::infer
