// The data-movement and optimizer kernels of kernels.h against their plain references: casts
// between f32 and bf16, sums, transposes, split and concat, AdamW and the clipping coefficient
// (kernels_test.cc has the rest, and says how the comparison works).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/kernels_testing.h"
#include "loom/kernels/cpu/reference.h"

namespace loom::kernels::cpu {
namespace {

using namespace test;

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Kernels, CastF32Bf16HandPicked) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80},  // 1.0 exact
      {0x3f808000, 0x3f80},  // 1 + 2^-8: tie, even stays (lsb 0)
      {0x3f818000, 0x3f82},  // tie with lsb 1: rounds up to even
      {0x3f808001, 0x3f81},  // just above the tie: up
      {0x3f807fff, 0x3f80},  // just below the tie: down
      {0xbfc00000, 0xbfc0},  // -1.5
      {0xbf818000, 0xbf82},  // negative tie, lsb 1: magnitude up
      {0x7f7fffff, 0x7f80},  // FLT_MAX rounds to +inf
      {0x7f800000, 0x7f80},  // +inf
      {0xff800000, 0xff80},  // -inf
      {0x7fc00000, 0x7fc0},  // quiet NaN
      {0x7f800001, 0x7fc0},  // signalling NaN: quieted, not rounded into inf
      {0xff810000, 0xffc1},  // negative NaN with payload: sign and top payload kept
      {0x00000000, 0x0000},  // +0
      {0x80000000, 0x8000},  // -0
      {0x00008000, 0x0000},  // denormal tie, lsb 0: down (not flushed differently)
      {0x00018000, 0x0002},  // denormal tie, lsb 1: up
      {0x007fffff, 0x0080},  // largest denormal rounds up to the smallest normal
  };
  const int64_t n = int64_t(std::size(cases));
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = from_bits(cases[i].in);
  std::vector<bf16> y(n);
  cast_f32_bf16(x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(y[i].bits, cases[i].out) << std::hex << "in 0x" << cases[i].in;
    EXPECT_EQ(f32_to_bf16(x[i]).bits, cases[i].out) << std::hex << "scalar, in 0x" << cases[i].in;
  }
}

TEST(Kernels, CastRandomBitsMatchScalar) {
  const int64_t n = 1 << 20;
  std::mt19937 rng(kSeed);
  std::vector<float> x(n);
  for (auto& v : x) v = from_bits(rng());  // every class: normals, denormals, inf, NaN
  std::vector<bf16> y(n), want(n);
  cast_f32_bf16(x.data(), y.data(), n);
  ref::cast_f32_bf16(x.data(), want.data(), n);
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), n * 2));

  std::vector<bf16> all(65536);
  for (int i = 0; i < 65536; ++i) all[i].bits = uint16_t(i);
  std::vector<float> back(65536);
  cast_bf16_f32(all.data(), back.data(), 65536);
  for (int i = 0; i < 65536; ++i) ASSERT_EQ(f32_bits(back[i]), uint32_t(i) << 16) << i;
}

// ---- reductions ----

TEST(Kernels, SumAndSumsq) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(100003), int64_t(1) << 20}) {
    auto x = randn(n, kSeed);
    for (auto& v : x) v += 0.1f;
    float s = 0, ss = 0;
    sum(x.data(), &s, n);
    sumsq(x.data(), &ss, n);
    double ws = 0, wss = 0;
    auto xd = to_f64(x);
    ref::sum(xd.data(), &ws, n);
    ref::sumsq(xd.data(), &wss, n);
    // f64 accumulation: only the final rounding to f32 remains.
    expect_close("sum", &s, &ws, 1, 1e-6, 1e-7);
    expect_close("sumsq", &ss, &wss, 1, 0, 1e-7);
  }
}

TEST(Kernels, SumRows) {
  for (auto [N, C] : kShapes) {
    auto x = randn(N * C, kSeed);
    Out y(C);
    sum_rows(x.data(), y.data(), N, C);
    std::vector<double> want(C);
    ref::sum_rows(to_f64(x).data(), want.data(), N, C);
    expect_close("sum_rows", y, want, 1e-6 * std::sqrt(double(N)), 1e-6);
  }
}

// ---- layout ----

void check_transpose(std::vector<int64_t> dims, std::vector<int> perm, int elem) {
  int64_t total = 1;
  for (int64_t d : dims) total *= d;
  std::mt19937 rng(kSeed);
  std::vector<uint8_t> x(total * elem), got(total * elem + 64, 0xab), want(total * elem);
  for (auto& b : x) b = uint8_t(rng());
  transpose(x.data(), got.data(), dims.data(), perm.data(), int(dims.size()), elem);
  ref::transpose(x.data(), want.data(), dims.data(), perm.data(), int(dims.size()), elem);
  std::ostringstream os;
  os << "dims";
  for (int64_t d : dims) os << " " << d;
  os << " perm";
  for (int p : perm) os << " " << p;
  os << " elem " << elem;
  const std::string what = os.str();
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), total * elem)) << what;
  for (int i = 0; i < 64; ++i) ASSERT_EQ(got[total * elem + i], 0xab) << what << ": overrun";
}

TEST(Kernels, TransposeCommonCases) {
  for (int elem : {2, 4}) {
    check_transpose({2, 37, 3, 18}, {0, 2, 1, 3}, elem);  // (B,T,H,D) -> (B,H,T,D)
    check_transpose({2, 3, 37, 18}, {0, 2, 1, 3}, elem);  // and back
    check_transpose({2, 37, 3, 18}, {0, 2, 3, 1}, elem);  // (B,T,H,D) -> (B,H,D,T)
    check_transpose({33, 70}, {1, 0}, elem);              // 2-D, partial tiles both ways
    check_transpose({1, 33, 1, 70}, {3, 2, 1, 0}, elem);  // size-1 dims dropped
    check_transpose({5, 7, 9}, {0, 1, 2}, elem);          // identity: one memcpy
    check_transpose({1000}, {0}, elem);                   // rank 1
    check_transpose({4, 0, 3}, {2, 1, 0}, elem);          // empty
    check_transpose({2, 3, 4, 5, 6}, {4, 1, 3, 0, 2}, elem);
  }
  check_transpose({7, 9, 5}, {2, 0, 1}, 1);
  check_transpose({7, 9, 5}, {1, 2, 0}, 8);
}

TEST(Kernels, TransposeEveryPermutationOf4D) {
  std::vector<int> perm = {0, 1, 2, 3};
  do {
    check_transpose({3, 5, 2, 7}, perm, 4);
    check_transpose({3, 1, 40, 7}, perm, 2);
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST(Kernels, SplitConcat) {
  const int64_t N = 131;
  const std::vector<int64_t> sizes = {5, 64, 1, 33};
  const int64_t W = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  auto x = randn(N * W, kSeed);
  std::vector<std::vector<float>> parts, want_parts;
  std::vector<float*> ptrs, want_ptrs;
  for (int64_t s : sizes) {
    parts.emplace_back(N * s);
    want_parts.emplace_back(N * s);
    ptrs.push_back(parts.back().data());
    want_ptrs.push_back(want_parts.back().data());
  }
  std::vector<void*> vptrs(ptrs.begin(), ptrs.end());
  split_last(x.data(), vptrs.data(), sizes.data(), int(sizes.size()), N, 4);
  ref::split_last(x.data(), want_ptrs.data(), sizes.data(), int(sizes.size()), N);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(parts[i], want_parts[i]) << "part " << i;
  std::vector<const void*> cptrs(ptrs.begin(), ptrs.end());
  std::vector<float> y(N * W);
  concat_last(cptrs.data(), y.data(), sizes.data(), int(sizes.size()), N, 4);
  EXPECT_EQ(y, x);
}

// The same on 2-byte elements (bf16 buckets: passes/gather_cast.cc): every element lands where
// the reference puts it.
TEST(Kernels, SplitConcatTwoBytes) {
  const int64_t N = 67;
  const std::vector<int64_t> sizes = {3, 128, 1, 17};
  const int64_t W = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  std::vector<uint16_t> x(size_t(N * W));
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint16_t(i * 2654435761u >> 7);
  std::vector<std::vector<uint16_t>> parts, want_parts;
  std::vector<void*> ptrs;
  std::vector<uint16_t*> want_ptrs;
  for (int64_t s : sizes) {
    parts.emplace_back(size_t(N * s));
    want_parts.emplace_back(size_t(N * s));
    ptrs.push_back(parts.back().data());
    want_ptrs.push_back(want_parts.back().data());
  }
  split_last(x.data(), ptrs.data(), sizes.data(), int(sizes.size()), N, 2);
  ref::split_last(x.data(), want_ptrs.data(), sizes.data(), int(sizes.size()), N);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(parts[i], want_parts[i]) << "part " << i;
  std::vector<const void*> cptrs(ptrs.begin(), ptrs.end());
  std::vector<uint16_t> y(size_t(N * W));
  concat_last(cptrs.data(), y.data(), sizes.data(), int(sizes.size()), N, 2);
  EXPECT_EQ(y, x);
}

// ---- optimizer ----

TEST(Kernels, AdamW) {
  const int64_t n = 100003;
  const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  auto p = randn(n, kSeed), m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
  auto pd = to_f64(p), md = to_f64(m), vd = to_f64(v);
  for (int t = 1; t <= 5; ++t) {
    auto g = randn(n, kSeed + t, 1e-2f);
    const float hyper[3] = {1e-3f, 1.0f - std::pow(b1, float(t)), 1.0f - std::pow(b2, float(t))};
    const float gscale = 0.7f;
    adamw(p.data(), g.data(), m.data(), v.data(), hyper, &gscale, n, b1, b2, eps, wd);
    const double hd[3] = {hyper[0], hyper[1], hyper[2]}, gsd = gscale;
    ref::adamw(pd.data(), to_f64(g).data(), md.data(), vd.data(), hd, &gsd, n, double(b1),
               double(b2), double(eps), double(wd));
  }
  expect_close("adamw p", p.data(), pd.data(), n, 1e-7, 1e-6);
  // m sums g's of both signs: elements near 0 have cancelled (|m| is ~1e-3 typically).
  expect_close("adamw m", m.data(), md.data(), n, 1e-9, 1e-5);
  expect_close("adamw v", v.data(), vd.data(), n, 1e-16, 1e-5);
}

TEST(Kernels, ClipCoef) {
  float coef = 0, norm = 0;
  const float total = 16.0f;
  clip_coef(&total, &coef, &norm, 1.0f);
  EXPECT_EQ(norm, 4.0f);
  EXPECT_FLOAT_EQ(coef, 1.0f / (4.0f + 1e-6f));
  clip_coef(&total, &coef, &norm, 10.0f);  // under the limit: no clipping
  EXPECT_EQ(coef, 1.0f);
  clip_coef(&total, &coef, &norm, 0.0f);  // clipping off
  EXPECT_EQ(coef, 1.0f);
  const float zero = 0.0f;
  clip_coef(&zero, &coef, &norm, 1.0f);
  EXPECT_EQ(norm, 0.0f);
  EXPECT_EQ(coef, 1.0f);
  double dc = 0, dn = 0;
  const double dt = 16.0;
  ref::clip_coef(&dt, &dc, &dn, 1.0);
  EXPECT_NEAR(dc, 1.0 / (4.0 + 1e-6), 1e-15);
}

}  // namespace
}  // namespace loom::kernels::cpu
