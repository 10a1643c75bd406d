// Samples of a profile: the median of repeated timings, one sample per distinct shape.
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "loom/calibrate/calibrate.h"

namespace loom::calibrate {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// (q, k and v share one shape, so the nodes that compute them give one sample.)
void dedupe(sim::Profile& p) {
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, DType>,
           std::vector<double>>
      mm;
  for (const auto& s : p.matmul)
    mm[{s.ta, s.tb, s.batch, s.m, s.n, s.k, s.dtype}].push_back(s.seconds);
  p.matmul.clear();
  for (const auto& [k, ts] : mm) {
    const auto [ta, tb, batch, m, n, kk, dt] = k;
    p.matmul.push_back({ta, tb, m, n, kk, batch, dt, median(ts)});
  }
  for (auto& [op, list] : p.ops) {
    struct Same {
      std::vector<double> seconds;
      double scratch = 0;  // the most any took
    };
    std::map<std::tuple<DType, double, double>, Same> by;
    for (const auto& s : list) {
      Same& e = by[{s.dtype, s.bytes, s.flops}];
      e.seconds.push_back(s.seconds);
      e.scratch = std::max(e.scratch, s.scratch_bytes);
    }
    list.clear();
    for (const auto& [k, e] : by)
      list.push_back(
          {std::get<0>(k), std::get<1>(k), std::get<2>(k), median(e.seconds), e.scratch});
  }
}

}  // namespace loom::calibrate
