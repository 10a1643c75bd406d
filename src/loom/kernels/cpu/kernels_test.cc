// Every fast kernel in kernels.h against its plain reference (reference.h) run in f64 on the same
// f32 inputs, at an awkward size (rows and columns not multiples of 16 or of any block) and a
// large one.
//
// Not here: thread-count parity (kernels_parity_test.cc) and finite-difference checks of the
// backward formulas (the op harness does those; here the reference defines the formula).
// Invariant: a comparison passes when |got - want| <= atol + rtol*|want| for every element; it
// prints the worst element otherwise, and checks guard words around every output for stray writes.
#include "loom/kernels/cpu/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/reference.h"

namespace loom::kernels::cpu {
namespace {

constexpr uint32_t kSeed = 20240601;  // printed by the failing comparison

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> uniform(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> rand_ids(int64_t n, int32_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

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

void expect_close(const char* what, const float* got, const double* want, int64_t n, double atol,
                  double rtol) {
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

void expect_close(const char* what, const Out& got, const std::vector<double>& want, double atol,
                  double rtol) {
  ASSERT_EQ(got.size(), int64_t(want.size())) << what;
  expect_close(what, got.data(), want.data(), got.size(), atol, rtol);
  EXPECT_TRUE(got.guards_intact()) << what << ": wrote outside its output";
}

struct RowsCols {
  int64_t N, C;
};
// Awkward (7 rows of 33), a multiple of nothing with several row blocks, and large.
const RowsCols kShapes[] = {{7, 33}, {130, 77}, {512, 512}};

// ---- embedding ----

TEST(Kernels, Embedding) {
  for (auto [N, C] : kShapes) {
    const int32_t V = int32_t(N / 3 + 2);  // fewer rows than ids: repeated ids accumulate
    auto ids = rand_ids(N, V, kSeed);
    auto table = randn(V * C, kSeed + 1);
    Out out(N * C);
    embedding_fwd(ids.data(), table.data(), out.data(), N, C);
    std::vector<double> want(size_t(N * C));
    ref::embedding_fwd(ids.data(), to_f64(table).data(), want.data(), N, C);
    expect_close("embedding_fwd", out, want, 0, 0);

    auto dout = randn(N * C, kSeed + 2);
    Out dtable(V * C);
    std::fill(dtable.data(), dtable.data() + V * C, 123.0f);  // must be overwritten
    embedding_bwd(ids.data(), dout.data(), dtable.data(), N, V, C);
    std::vector<double> dwant(size_t(V * C));
    ref::embedding_bwd(ids.data(), to_f64(dout).data(), dwant.data(), N, V, C);
    expect_close("embedding_bwd", dtable, dwant, 1e-5, 1e-5);
    // Same order of additions as the f32 reference: bit-identical to it.
    std::vector<float> fwant(size_t(V * C));
    ref::embedding_bwd(ids.data(), dout.data(), fwant.data(), N, V, C);
    EXPECT_EQ(0, std::memcmp(fwant.data(), dtable.data(), fwant.size() * 4)) << "N " << N;
  }
}

// ---- norms ----

TEST(Kernels, RmsNorm) {
  for (auto [N, C] : kShapes) {
    auto x = randn(N * C, kSeed, 2.0f);
    auto w = uniform(C, kSeed + 1, 0.5f, 1.5f);
    auto dy = randn(N * C, kSeed + 2);
    const float eps = 1e-5f;
    Out y(N * C), rstd(N), dx(N * C), dw(C);
    rmsnorm_fwd(x.data(), w.data(), y.data(), rstd.data(), N, C, eps);
    rmsnorm_bwd(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), N, C);

    std::vector<double> wy(N * C), wrstd(N), wdx(N * C), wdw(C);
    auto xd = to_f64(x), wd = to_f64(w), dyd = to_f64(dy);
    ref::rmsnorm_fwd(xd.data(), wd.data(), wy.data(), wrstd.data(), N, C, double(eps));
    ref::rmsnorm_bwd(dyd.data(), xd.data(), wd.data(), wrstd.data(), wdx.data(), wdw.data(), N, C);
    expect_close("rmsnorm y", y, wy, 1e-6, 1e-5);
    expect_close("rmsnorm rstd", rstd, wrstd, 0, 1e-5);
    expect_close("rmsnorm dx", dx, wdx, 1e-6, 1e-4);
    expect_close("rmsnorm dw", dw, wdw, 1e-5 * std::sqrt(double(N)), 1e-5);
  }
}

TEST(Kernels, LayerNorm) {
  for (auto [N, C] : kShapes) {
    auto x = randn(N * C, kSeed, 2.0f);
    for (auto& v : x) v += 3.0f;  // a mean well away from zero
    auto w = uniform(C, kSeed + 1, 0.5f, 1.5f);
    auto b = randn(C, kSeed + 3);
    auto dy = randn(N * C, kSeed + 2);
    const float eps = 1e-5f;
    Out y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
    layernorm_fwd(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, eps);
    layernorm_bwd(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                  db.data(), N, C);

    std::vector<double> wy(N * C), wmean(N), wrstd(N), wdx(N * C), wdw(C), wdb(C);
    auto xd = to_f64(x), wd = to_f64(w), bd = to_f64(b), dyd = to_f64(dy);
    ref::layernorm_fwd(xd.data(), wd.data(), bd.data(), wy.data(), wmean.data(), wrstd.data(), N, C,
                       double(eps));
    ref::layernorm_bwd(dyd.data(), xd.data(), wd.data(), wmean.data(), wrstd.data(), wdx.data(),
                       wdw.data(), wdb.data(), N, C);
    expect_close("layernorm y", y, wy, 1e-5, 1e-5);
    expect_close("layernorm mean", mean, wmean, 1e-6, 1e-6);
    expect_close("layernorm rstd", rstd, wrstd, 0, 1e-5);
    expect_close("layernorm dx", dx, wdx, 1e-5, 1e-4);
    expect_close("layernorm dw", dw, wdw, 1e-5 * std::sqrt(double(N)), 1e-5);
    expect_close("layernorm db", db, wdb, 1e-5 * std::sqrt(double(N)), 1e-5);
  }
}

// ---- rope ----

struct RopeShape {
  int64_t B, T, NH, HS;
};
const RopeShape kRopeShapes[] = {{1, 7, 3, 2}, {2, 37, 3, 18}, {2, 300, 4, 64}};

TEST(Kernels, RopeMatchesReference) {
  for (auto [B, T, NH, HS] : kRopeShapes) {
    const int64_t n = B * T * NH * HS;
    auto x = randn(n, kSeed);
    for (int sign : {1, -1}) {
      Out y(n);
      rope(x.data(), y.data(), B, T, NH, HS, 10000.0f, sign);
      std::vector<double> want(n);
      ref::rope(to_f64(x).data(), want.data(), B, T, NH, HS, 10000.0, sign);
      expect_close(sign > 0 ? "rope +1" : "rope -1", y, want, 1e-6, 1e-5);
    }
  }
}

TEST(Kernels, RopeInverseAndInPlace) {
  const int64_t B = 2, T = 300, NH = 3, HS = 64, n = B * T * NH * HS;
  auto x = randn(n, kSeed);
  Out y(n);
  rope(x.data(), y.data(), B, T, NH, HS, 500000.0f, 1);
  std::vector<float> z(y.data(), y.data() + n);
  rope(z.data(), z.data(), B, T, NH, HS, 500000.0f, -1);  // in place: y aliases x
  expect_close("rope(-1) after rope(+1)", z.data(), to_f64(x).data(), n, 1e-6, 1e-6);
  std::vector<float> w(x);
  rope(w.data(), w.data(), B, T, NH, HS, 500000.0f, 1);
  EXPECT_EQ(0, std::memcmp(w.data(), y.data(), n * 4)) << "in-place rope differs from out-of-place";
}

// rope from a first position t0 (a decode step's new tokens) rotates each row exactly as the full
// rope does at that position: bit for bit, at starts inside and on block boundaries.
TEST(Kernels, RopeFromAnOffsetEqualsTheFullRows) {
  const int64_t B = 1, T = 70, NH = 3, HS = 64, row = NH * HS;
  auto x = randn(B * T * row, kSeed);
  Out full(B * T * row);
  rope(x.data(), full.data(), B, T, NH, HS, 10000.0f, 1);
  for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {16, 16}, {17, 30}, {69, 1}}) {
    std::vector<float> part(x.begin() + t0 * row, x.begin() + (t0 + n) * row), got(part.size());
    rope(part.data(), got.data(), B, n, NH, HS, 10000.0f, 1, t0);
    EXPECT_EQ(0, std::memcmp(got.data(), full.data() + t0 * row, got.size() * 4))
        << "rows " << t0 << ".." << t0 + n - 1;
  }
}

// ---- the vectorised exp behind softmax and the activations ----

TEST(Kernels, ExpF32WithinOneUlp) {
  std::vector<float> xs;
  for (double x = -110.0; x < 90.0; x += 1.1e-4) xs.push_back(float(x));
  for (float x : {0.0f, -0.0f, 88.72f, 88.73f, -87.33f, -103.9f, -104.5f, 1e-30f, -1e-30f})
    xs.push_back(x);
  double worst_ulp = 0;
  float worst_x = 0;
  for (float x : xs) {
    const float got = detail::exp_f32(x);
    const double want = std::exp(double(x));
    const float want_f = float(want);
    if (std::isinf(want_f)) {
      EXPECT_TRUE(std::isinf(got)) << "x " << x;
      continue;
    }
    // ulp of the f32 result; in the denormal range a fixed 2^-149.
    const double ulp = std::max(double(std::nextafter(want_f, INFINITY) - want_f), 0x1p-149);
    const double e = std::fabs(double(got) - want) / ulp;
    if (e > worst_ulp) worst_ulp = e, worst_x = x;
  }
  EXPECT_LE(worst_ulp, 1.0) << "at x = " << worst_x;
  EXPECT_TRUE(std::isnan(detail::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(detail::exp_f32(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(detail::exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
#ifdef __AVX512F__
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  while (xs.size() % 16) xs.push_back(1.0f);
  std::vector<float> vec(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16)
    _mm512_storeu_ps(vec.data() + i, detail::exp_f32x16(_mm512_loadu_ps(xs.data() + i)));
  for (size_t i = 0; i < xs.size(); ++i) {
    const float s = detail::exp_f32(xs[i]);
    ASSERT_EQ(0, std::memcmp(&s, &vec[i], 4)) << "16-lane exp differs at x = " << xs[i];
  }
#endif
}

// ---- activations ----

// Random values plus the extremes where a naive formula cancels or overflows.
std::vector<float> activation_inputs(int64_t n) {
  auto x = randn(n, kSeed, 3.0f);
  const float special[] = {0.0f,  -0.0f,  1e-30f, -1e-30f, 5.0f,   -5.0f,   10.0f, -10.0f,
                           30.0f, -30.0f, 88.0f,  -88.0f,  100.0f, -100.0f, 1e4f,  -1e4f};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = special[i];
  return x;
}

TEST(Kernels, SwiGlu) {
  for (int64_t n : {7, 33, 100003}) {
    auto g = activation_inputs(n), u = randn(n, kSeed + 1), dy = randn(n, kSeed + 2);
    Out y(n), dg(n), du(n);
    swiglu_fwd(g.data(), u.data(), y.data(), n);
    swiglu_bwd(dy.data(), g.data(), u.data(), dg.data(), du.data(), n);
    std::vector<double> wy(n), wdg(n), wdu(n);
    auto gd = to_f64(g), ud = to_f64(u), dyd = to_f64(dy);
    ref::swiglu_fwd(gd.data(), ud.data(), wy.data(), n);
    ref::swiglu_bwd(dyd.data(), gd.data(), ud.data(), wdg.data(), wdu.data(), n);
    expect_close("swiglu y", y, wy, 1e-30, 1e-6);
    // dsilu/dg = s*(1 + g*(1-s)) has a root at g = -1.278; near it only an absolute bound holds.
    expect_close("swiglu dg", dg, wdg, 1e-7, 2e-6);
    expect_close("swiglu du", du, wdu, 1e-30, 1e-6);
  }
}

TEST(Kernels, Gelu) {
  for (int64_t n : {7, 33, 100003}) {
    auto x = activation_inputs(n), dy = randn(n, kSeed + 2);
    Out y(n), dx(n);
    gelu_fwd(x.data(), y.data(), n);
    gelu_bwd(dy.data(), x.data(), dx.data(), n);
    std::vector<double> wy(n), wdx(n);
    auto xd = to_f64(x), dyd = to_f64(dy);
    ref::gelu_fwd(xd.data(), wy.data(), n);
    ref::gelu_bwd(dyd.data(), xd.data(), wdx.data(), n);
    // atol: for x << 0 gelu is tiny and its relative condition number is large (~x^2).
    expect_close("gelu y", y, wy, 1e-7, 1e-6);
    expect_close("gelu dx", dx, wdx, 1e-7, 2e-6);
  }
}

// ---- cross-entropy ----

TEST(Kernels, CrossEntropy) {
  struct Case {
    int64_t N, V;
    float scale, offset;
  };
  for (auto [N, V, scale, offset] :
       {Case{7, 33, 1.0f, 0.0f}, Case{5, 1000, 10.0f, 100.0f}, Case{64, 8192, 3.0f, -50.0f}}) {
    auto logits = randn(N * V, kSeed, scale);
    for (auto& v : logits) v += offset;
    auto targets = rand_ids(N, int32_t(V), kSeed + 1);
    Out dlogits(N * V), loss(1);
    cross_entropy(logits.data(), targets.data(), loss.data(), dlogits.data(), N, V);
    std::vector<double> wdl(N * V), wloss(1);
    ref::cross_entropy(to_f64(logits).data(), targets.data(), wloss.data(), wdl.data(), N, V);
    expect_close("cross_entropy loss", loss, wloss, 0, 1e-6);
    expect_close("cross_entropy dlogits", dlogits, wdl, 1e-12, 1e-5);

    // In place (dlogits aliases logits) gives the same bits; loss only gives the same loss.
    std::vector<float> inplace(logits);
    float loss2 = 0, loss3 = 0;
    cross_entropy(inplace.data(), targets.data(), &loss2, inplace.data(), N, V);
    EXPECT_EQ(loss2, loss.data()[0]);
    EXPECT_EQ(0, std::memcmp(inplace.data(), dlogits.data(), inplace.size() * 4));
    cross_entropy(logits.data(), targets.data(), &loss3, nullptr, N, V);
    EXPECT_EQ(loss3, loss.data()[0]);
  }
}

// ---- elementwise: one rounding each, so bit-identical to the f32 reference ----

TEST(Kernels, Elementwise) {
  for (auto [N, C] : kShapes) {
    const int64_t n = N * C * 3 + 5;  // several elementwise blocks at the large size
    auto a = randn(n, kSeed), b = randn(n, kSeed + 1), s = randn(1, kSeed + 2);
    auto bias = randn(C, kSeed + 3);
    std::vector<float> got(n), want(n);
    auto check = [&](const char* what, int64_t m) {
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), m * 4)) << what << " n " << m;
    };
    add(a.data(), b.data(), got.data(), n);
    ref::add(a.data(), b.data(), want.data(), n);
    check("add", n);
    mul(a.data(), b.data(), got.data(), n);
    ref::mul(a.data(), b.data(), want.data(), n);
    check("mul", n);
    scale(a.data(), 0.37f, got.data(), n);
    ref::scale(a.data(), 0.37f, want.data(), n);
    check("scale", n);
    mul_scalar(a.data(), s.data(), got.data(), n);
    ref::mul_scalar(a.data(), s.data(), want.data(), n);
    check("mul_scalar", n);
    add_bias(a.data(), bias.data(), got.data(), N, C);
    ref::add_bias(a.data(), bias.data(), want.data(), N, C);
    check("add_bias", N * C);
    std::vector<float> inplace(a);  // y == a
    add(inplace.data(), b.data(), inplace.data(), n);
    ref::add(a.data(), b.data(), want.data(), n);
    EXPECT_EQ(0, std::memcmp(inplace.data(), want.data(), n * 4)) << "add in place";
  }
}

// ---- casts ----

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
