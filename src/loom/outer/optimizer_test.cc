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

// A period closed early moves p and m as a last push of zeros would, and a sync round of the N
// islands with the missing ones' pseudo-gradients zero.
TEST(OuterOptimizer, ClosingAPeriodEarlyIsAZeroLastPush) {
  OuterOptConfig c{0.7, 0.9};
  const int N = 4;
  TensorList p1 = random_list(3), p2 = p1, ps = p1, m1 = zeros_like(p1), m2 = m1, ms = m1, b1 = m1,
             b2 = m1;
  int64_t c1 = 0, c2 = 0;
  TensorList mean = zeros_like(p1);
  for (int k = 0; k < 2; ++k) {  // two of the four push
    TensorList g = random_list(200 + uint32_t(k));
    delayed_nesterov_push(c, N, p1, m1, b1, c1, g);
    delayed_nesterov_push(c, N, p2, m2, b2, c2, g);
    for (size_t t = 0; t < g.size(); ++t)
      for (size_t i = 0; i < g[t].data.size(); ++i) mean[t].data[i] += g[t].data[i] / N;
  }
  delayed_nesterov_close(c, N, p1, m1, b1, c1);
  c2 = N - 1;  // the zero push closes the period
  delayed_nesterov_push(c, N, p2, m2, b2, c2, zeros_like(p2));
  nesterov_step(c, ps, ms, mean);
  EXPECT_EQ(c1, 0);
  EXPECT_EQ(c2, 0);
  for (size_t t = 0; t < p1.size(); ++t)
    for (size_t i = 0; i < p1[t].data.size(); ++i) {
      ASSERT_NEAR(p1[t].data[i], p2[t].data[i], 1e-6);
      ASSERT_NEAR(m1[t].data[i], m2[t].data[i], 1e-6);
      ASSERT_NEAR(p1[t].data[i], ps[t].data[i], 1e-5);
      ASSERT_NEAR(m1[t].data[i], ms[t].data[i], 1e-5);
      ASSERT_EQ(b1[t].data[i], 0.f);
    }
}

}  // namespace
}  // namespace loom::outer
