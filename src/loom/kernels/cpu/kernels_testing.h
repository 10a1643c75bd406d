// What the kernel tests share: seeded inputs, an output buffer with guard words, and the
// comparison against the f64 reference (kernels_test.cc, kernels_data_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace loom::kernels::cpu::test {

constexpr uint32_t kSeed = 20240601;  // printed by the failing comparison

inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> uniform(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> rand_ids(int64_t n, int32_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// An f32 output buffer with kGuard words of a NaN pattern on each side.
class Out {
 public:
  explicit Out(int64_t n) : v_(size_t(n + 2 * kGuard), 0.0f) {
    for (int64_t i = 0; i < kGuard; ++i) v_[i] = v_[v_.size() - 1 - i] = guard();
  }
  float* data() { return v_.data() + kGuard; }
  const float* data() const { return v_.data() + kGuard; }
  int64_t size() const { return int64_t(v_.size()) - 2 * kGuard; }
  bool guards_intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (bits(v_[i]) != bits(guard()) || bits(v_[v_.size() - 1 - i]) != bits(guard()))
        return false;
    return true;
  }

 private:
  static constexpr int64_t kGuard = 16;
  static uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  static float guard() {
    const uint32_t u = 0x7fc0dead;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  std::vector<float> v_;
};

inline void expect_close(const char* what, const float* got, const double* want, int64_t n,
                         double atol, double rtol) {
  int64_t worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double tol = atol + rtol * std::fabs(want[i]);
    const bool bad = !(err <= tol);  // NaN counts as bad
    if (bad && (worst < 0 || !(err - tol <= worst_excess))) {
      worst = i;
      worst_excess = err - tol;
    }
  }
  EXPECT_LT(worst, 0) << what << ": worst element " << worst << " got " << got[worst] << " want "
                      << want[worst] << " (atol " << atol << ", rtol " << rtol << ", n " << n
                      << ", seed " << kSeed << ")";
}

inline void expect_close(const char* what, const Out& got, const std::vector<double>& want,
                         double atol, double rtol) {
  ASSERT_EQ(got.size(), int64_t(want.size())) << what;
  expect_close(what, got.data(), want.data(), got.size(), atol, rtol);
  EXPECT_TRUE(got.guards_intact()) << what << ": wrote outside its output";
}

struct RowsCols {
  int64_t N, C;
};
// Awkward (7 rows of 33), a multiple of nothing with several row blocks, and large.
inline const RowsCols kShapes[] = {{7, 33}, {130, 77}, {512, 512}};

}  // namespace loom::kernels::cpu::test
