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
    std::map<std::tuple<DType, double, double>, std::vector<double>> by;
    std::map<std::tuple<DType, double, double>, double> scratch;  // the most any took
    for (const auto& s : list) {
      by[{s.dtype, s.bytes, s.flops}].push_back(s.seconds);
      double& most = scratch[{s.dtype, s.bytes, s.flops}];
      most = std::max(most, s.scratch_bytes);
    }
    list.clear();
    for (const auto& [k, ts] : by)
      list.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), median(ts), scratch[k]});
  }
}

}  // namespace loom::calibrate
