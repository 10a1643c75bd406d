// The outer optimizer against its formulas, written out per element.
#include "loom/outer/optimizer.h"

#include <gtest/gtest.h>

#include "loom/outer/testing.h"

namespace loom::outer {
namespace {

TensorList random_list(uint32_t seed) {
  return test::random_like({{"w", {4, 5}, {}}, {"b", {3}, {}}}, seed);
}

TEST(OuterOptimizer, NesterovMatchesItsFormula) {
  OuterOptConfig c{0.7, 0.9};
  TensorList p = random_list(1), m = zeros_like(p);
  TensorList p0 = p;
  std::vector<float> mref(20, 0.f), pref = p0[0].data;
  for (uint32_t step = 0; step < 3; ++step) {
    TensorList g = random_list(10 + step);
    nesterov_step(c, p, m, g);
    for (size_t i = 0; i < 20; ++i) {
      mref[i] = 0.9f * mref[i] + g[0].data[i];
      pref[i] -= 0.7f * (g[0].data[i] + 0.9f * mref[i]);
    }
  }
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_FLOAT_EQ(m[0].data[i], mref[i]);
    EXPECT_FLOAT_EQ(p[0].data[i], pref[i]);
  }
}

TEST(OuterOptimizer, DelayedNesterovWithPeriodOneIsNesterov) {
  OuterOptConfig c{0.5, 0.8};
  TensorList p1 = random_list(2), p2 = p1, m1 = zeros_like(p1), m2 = m1, buf = m1;
  int64_t count = 0;
  for (uint32_t s = 0; s < 4; ++s) {
    TensorList g = random_list(20 + s);
    nesterov_step(c, p1, m1, g);
    delayed_nesterov_push(c, 1, p2, m2, buf, count, g);
  }
  EXPECT_EQ(count, 0);  // each push closed its period
  for (size_t t = 0; t < p1.size(); ++t)
    for (size_t i = 0; i < p1[t].data.size(); ++i) EXPECT_NEAR(p1[t].data[i], p2[t].data[i], 1e-6);
}

// N pushes under Delayed Nesterov move the parameters as one sync round on their mean does.
TEST(OuterOptimizer, DelayedNesterovOverAPeriodIsASyncRound) {
  OuterOptConfig c{0.7, 0.9};
  const int N = 4;
  TensorList ps = random_list(3), pa = ps, ms = zeros_like(ps), ma = ms, buf = ms;
  int64_t count = 0;
  for (int round = 0; round < 3; ++round) {
    TensorList mean = zeros_like(ps);
    for (int k = 0; k < N; ++k) {
      TensorList g = random_list(100 + uint32_t(round * N + k));
      delayed_nesterov_push(c, N, pa, ma, buf, count, g);
      for (size_t t = 0; t < g.size(); ++t)
        for (size_t i = 0; i < g[t].data.size(); ++i) mean[t].data[i] += g[t].data[i] / N;
    }
    nesterov_step(c, ps, ms, mean);
    for (size_t t = 0; t < ps.size(); ++t)
      for (size_t i = 0; i < ps[t].data.size(); ++i) {
        ASSERT_NEAR(ps[t].data[i], pa[t].data[i], 1e-5) << "round " << round;
        ASSERT_NEAR(ms[t].data[i], ma[t].data[i], 1e-5);
        ASSERT_EQ(buf[t].data[i], 0.f);
      }
  }
}

}  // namespace
}  // namespace loom::outer
