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
#include "loom/kernels/cpu/kernels_testing.h"
#include "loom/kernels/cpu/reference.h"

namespace loom::kernels::cpu {
namespace {

using namespace test;

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

// Vocabulary-parallel: the logits' columns in K blocks, each block's softmax_stats gathered, and
// cross_entropy_split on each block gives the whole row's loss (summed over the blocks) and its
// dlogits (the blocks side by side), against the f64 reference; every block sees the same
// logsumexp, and a block may alias its dlogits to its logits.
TEST(Kernels, CrossEntropySplitOverTheVocabulary) {
  struct Case {
    int64_t N, V, K;
    float scale, offset;
  };
  for (auto [N, V, K, scale, offset] : {Case{7, 36, 2, 1.0f, 0.0f}, Case{5, 999, 3, 10.0f, 100.0f},
                                        Case{64, 8192, 4, 3.0f, -50.0f}}) {
    SCOPED_TRACE(::testing::Message() << "N " << N << " V " << V << " K " << K);
    auto logits = randn(N * V, kSeed, scale);
    for (auto& v : logits) v += offset;
    auto targets = rand_ids(N, int32_t(V), kSeed + 1);
    std::vector<double> wdl(N * V), wloss(1);
    ref::cross_entropy(to_f64(logits).data(), targets.data(), wloss.data(), wdl.data(), N, V);
    const int64_t B = V / K;
    std::vector<std::vector<float>> block(K, std::vector<float>(N * B));
    std::vector<std::vector<int32_t>> local(K, std::vector<int32_t>(N));
    std::vector<float> stats(K * N * 3);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(&block[k][n * B], &logits[n * V + k * B], B * 4);
        const int32_t t = targets[n] - int32_t(k * B);
        local[k][n] = t >= 0 && t < B ? t : -1;
      }
      softmax_stats(block[k].data(), local[k].data(), &stats[k * N * 3], N, B);
    }
    Out dlogits(N * V), loss(1);
    double total = 0;
    for (int64_t k = 0; k < K; ++k) {
      float part = 0;
      cross_entropy_split(block[k].data(), local[k].data(), stats.data(), K, &part, block[k].data(),
                          N, B);
      total += part;
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(dlogits.data() + n * V + k * B, &block[k][n * B], B * 4);
    }
    loss.data()[0] = float(total);
    expect_close("split loss", loss, wloss, 0, 1e-6);
    expect_close("split dlogits", dlogits, wdl, 1e-12, 1e-5);
  }
}

// An id of -1 (outside a vocabulary-parallel rank's block) is a zero row forward and nothing
// backward.
TEST(Kernels, EmbeddingSkipsMaskedIds) {
  const int64_t V = 5, C = 3, N = 4;
  const std::vector<int32_t> ids = {2, -1, 2, 4};
  auto table = randn(V * C, kSeed);
  auto dout = randn(N * C, kSeed + 1);
  std::vector<float> out(N * C, 7.f), dtable(V * C, 7.f);
  embedding_fwd(ids.data(), table.data(), out.data(), N, C);
  embedding_bwd(ids.data(), dout.data(), dtable.data(), N, V, C);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(out[0 * C + c], table[2 * C + c]);
    EXPECT_EQ(out[1 * C + c], 0.f);
    EXPECT_EQ(out[3 * C + c], table[4 * C + c]);
    EXPECT_EQ(dtable[2 * C + c], dout[0 * C + c] + dout[2 * C + c]);
    EXPECT_EQ(dtable[4 * C + c], dout[3 * C + c]);
    for (int64_t v : {0, 1, 3}) EXPECT_EQ(dtable[v * C + c], 0.f);
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

}  // namespace
}  // namespace loom::kernels::cpu
