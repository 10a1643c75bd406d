// Tests of the fast causal attention kernels (attention.cc) against the plain reference
// (attention_ref.h): f32 forward and backward against the f64 reference, bf16 against the reference
// run on the same bf16-rounded inputs, the reference backward and the fast one against central
// differences of the f64 reference forward, guard elements after every output, and bit-identical
// results for 1 and 2 threads. Timing is not tested here.
#include "loom/kernels/cpu/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cpu/attention_ref.h"

namespace loom::kernels::cpu {
namespace {

struct Shape {
  int64_t B, T, NH, NKV, HS;
};

std::string name(const Shape& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "B=%ld T=%ld NH=%ld NKV=%ld HS=%ld", long(s.B), long(s.T),
                long(s.NH), long(s.NKV), long(s.HS));
  return buf;
}

// Normal(0, sd) values, rounded through bf16 when `round_bf16` (so f32 and bf16 runs see the same).
std::vector<float> random(int64_t n, uint32_t seed, float sd, bool round_bf16) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, sd);
  std::vector<float> x(n);
  for (float& e : x) {
    e = dist(gen);
    if (round_bf16) e = bf16_to_f32(f32_to_bf16(e));
  }
  return x;
}

std::vector<double> to_f64(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Elem buffer with kGuard sentinel elements after the n real ones.
constexpr int64_t kGuard = 37;
template <class Elem>
struct Buf {
  std::vector<Elem> v;
  int64_t n;
  explicit Buf(int64_t n_) : v(n_ + kGuard), n(n_) {
    for (int64_t i = 0; i < n_ + kGuard; ++i) v[i] = sentinel(i);
  }
  static Elem sentinel(int64_t i) {
    if constexpr (std::is_same_v<Elem, float>)
      return float(-1e30) * float(i + 1);
    else
      return f32_to_bf16(float(-1e30) * float(i + 1));
  }
  Elem* data() { return v.data(); }
  bool guards_intact() const {
    for (int64_t i = n; i < n + kGuard; ++i) {
      const Elem want = sentinel(i);
      if (std::memcmp(&v[i], &want, sizeof(Elem)) != 0) return false;
    }
    return true;
  }
  static float to_f32(Elem e) {
    if constexpr (std::is_same_v<Elem, float>)
      return e;
    else
      return bf16_to_f32(e);
  }
  std::vector<float> f32() const {
    std::vector<float> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = to_f32(v[i]);
    return r;
  }
};

template <class Elem>
Buf<Elem> from(const std::vector<float>& x) {
  Buf<Elem> b(int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<Elem, float>)
      b.v[i] = x[i];
    else
      b.v[i] = f32_to_bf16(x[i]);
  }
  return b;
}

// |got - want| <= atol + rtol * |want| everywhere; on failure names the worst element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double atol,
                  double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]) - (atol + rtol * std::abs(want[i]));
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? 1e300 : err;
      at = i;
    }
    if (std::isnan(err)) break;
  }
  EXPECT_LE(worst, 0.0) << what << ": worst element " << at << " got " << got[at] << " want "
                        << want[at] << " (atol " << atol << ", rtol " << rtol << ")";
}

// Inputs of one case, as f32 values (already bf16-rounded for bf16 cases).
struct Case {
  Shape s;
  float scale;
  std::vector<float> q, k, v, dout;
  Case(Shape s_, uint32_t seed, bool round_bf16, float qsd = 1.f) : s(s_) {
    scale = 1.f / std::sqrt(float(s.HS));
    const int64_t nq = s.B * s.T * s.NH * s.HS, nkv = s.B * s.T * s.NKV * s.HS;
    q = random(nq, seed, qsd, round_bf16);
    k = random(nkv, seed + 1, 1.f, round_bf16);
    v = random(nkv, seed + 2, 1.f, round_bf16);
    dout = random(nq, seed + 3, 1.f, round_bf16);
  }
};

struct RefOut {
  std::vector<double> o, lse, dq, dk, dv;
};

RefOut run_ref(const Case& c) {
  const Shape& s = c.s;
  RefOut r;
  const auto q = to_f64(c.q), k = to_f64(c.k), v = to_f64(c.v), dout = to_f64(c.dout);
  r.o.resize(q.size());
  r.lse.resize(s.B * s.NH * s.T);
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  ref::attention_fwd<double>(q.data(), k.data(), v.data(), r.o.data(), r.lse.data(), s.B, s.T, s.NH,
                             s.NKV, s.HS, c.scale);
  ref::attention_bwd<double>(dout.data(), q.data(), k.data(), v.data(), r.o.data(), r.lse.data(),
                             r.dq.data(), r.dk.data(), r.dv.data(), s.B, s.T, s.NH, s.NKV, s.HS,
                             c.scale);
  return r;
}

template <class Elem>
struct FastOut {
  Buf<Elem> o, dq, dk, dv;
  Buf<float> lse;
  explicit FastOut(const Shape& s)
      : o(s.B * s.T * s.NH * s.HS),
        dq(s.B * s.T * s.NH * s.HS),
        dk(s.B * s.T * s.NKV * s.HS),
        dv(s.B * s.T * s.NKV * s.HS),
        lse(s.B * s.NH * s.T) {}
};

template <class Elem>
FastOut<Elem> run_fast(const Case& c) {
  const Shape& s = c.s;
  FastOut<Elem> r(s);
  auto q = from<Elem>(c.q), k = from<Elem>(c.k), v = from<Elem>(c.v), dout = from<Elem>(c.dout);
  attention_fwd<Elem>(q.data(), k.data(), v.data(), r.o.data(), r.lse.data(), s.B, s.T, s.NH, s.NKV,
                      s.HS, c.scale);
  attention_bwd<Elem>(dout.data(), q.data(), k.data(), v.data(), r.o.data(), r.lse.data(),
                      r.dq.data(), r.dk.data(), r.dv.data(), s.B, s.T, s.NH, s.NKV, s.HS, c.scale);
  EXPECT_TRUE(r.o.guards_intact() && r.lse.guards_intact() && r.dq.guards_intact() &&
              r.dk.guards_intact() && r.dv.guards_intact())
      << name(s) << ": an output was written past its end";
  return r;
}

const Shape kShapes[] = {
    {2, 37, 4, 2, 16},    // GQA, T not a multiple of the block
    {2, 37, 4, 2, 64},    //
    {2, 150, 4, 2, 64},   // several blocks, partial last one
    {1, 130, 4, 1, 16},   // all query heads on one kv head
    {2, 70, 2, 2, 24},    // HS not a multiple of 16
    {1, 128, 2, 2, 128},  // two 4-vector column chunks
    {2, 1, 2, 1, 16},     // a single token
};

TEST(Attention, F32MatchesReference) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const Case c(s, seed += 10, false);
    const RefOut want = run_ref(c);
    const auto got = run_fast<float>(c);
    const std::string n = name(s);
    expect_close(got.o.f32(), want.o, 1e-5, 1e-5, n + " o");
    expect_close(got.lse.f32(), want.lse, 1e-5, 1e-5, n + " lse");
    expect_close(got.dq.f32(), want.dq, 1e-5, 1e-5, n + " dq");
    expect_close(got.dk.f32(), want.dk, 1e-5, 1e-5, n + " dk");
    expect_close(got.dv.f32(), want.dv, 1e-5, 1e-5, n + " dv");
  }
}

// Peaked softmax (scores with sd ~ 8): the online max and the rescaling of O matter here.
TEST(Attention, F32LargeScores) {
  const Shape s{1, 200, 2, 1, 64};
  const Case c(s, 77, false, 8.f);
  const RefOut want = run_ref(c);
  const auto got = run_fast<float>(c);
  expect_close(got.o.f32(), want.o, 1e-5, 1e-5, "o");
  expect_close(got.lse.f32(), want.lse, 1e-5, 1e-5, "lse");
  expect_close(got.dq.f32(), want.dq, 1e-4, 1e-4, "dq");
  expect_close(got.dk.f32(), want.dk, 1e-4, 1e-4, "dk");
  expect_close(got.dv.f32(), want.dv, 1e-5, 1e-4, "dv");
}

// bf16 storage: the reference runs in f64 on the same bf16-rounded inputs; the fast outputs carry
// one bf16 rounding (2^-9 relative) plus, for the backward, the rounding of o fed back in.
TEST(Attention, Bf16MatchesReference) {
  uint32_t seed = 500;
  for (const Shape& s : kShapes) {
    const Case c(s, seed += 10, true);
    const RefOut want = run_ref(c);
    const auto got = run_fast<bf16>(c);
    const std::string n = name(s);
    expect_close(got.o.f32(), want.o, 4e-3, 8e-3, n + " o");
    expect_close(got.lse.f32(), want.lse, 1e-4, 1e-4, n + " lse");
    expect_close(got.dq.f32(), want.dq, 2e-2, 2e-2, n + " dq");
    expect_close(got.dk.f32(), want.dk, 2e-2, 2e-2, n + " dk");
    expect_close(got.dv.f32(), want.dv, 2e-2, 2e-2, n + " dv");
  }
}

// loss = sum(o * r): dL/dx by central differences of the f64 reference forward, against the f64
// reference backward and the fast f32 backward. GQA, HS = 4 (padded inside the fast kernel).
TEST(Attention, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 6, 4, 2, 4};
  const Case c(s, 900, false);  // c.dout plays r
  const RefOut an = run_ref(c);
  const auto fast = run_fast<float>(c);
  std::vector<double> q = to_f64(c.q), k = to_f64(c.k), v = to_f64(c.v), r = to_f64(c.dout);
  std::vector<double> o(q.size()), lse(s.B * s.NH * s.T);
  auto loss = [&] {
    ref::attention_fwd<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), s.B, s.T, s.NH,
                               s.NKV, s.HS, c.scale);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * r[i];
    return l;
  };
  const double eps = 1e-5;
  auto numeric = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double lp = loss();
      x[i] = x0 - eps;
      const double lm = loss();
      x[i] = x0;
      g[i] = (lp - lm) / (2 * eps);
    }
    return g;
  };
  const auto gq = numeric(q), gk = numeric(k), gv = numeric(v);
  auto as_f32 = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  // The reference is checked in f64 (rounding through f32 for the comparison helper costs ~1e-7).
  expect_close(as_f32(an.dq), gq, 1e-6, 1e-6, "ref dq");
  expect_close(as_f32(an.dk), gk, 1e-6, 1e-6, "ref dk");
  expect_close(as_f32(an.dv), gv, 1e-6, 1e-6, "ref dv");
  expect_close(fast.dq.f32(), gq, 1e-5, 1e-4, "fast dq");
  expect_close(fast.dk.f32(), gk, 1e-5, 1e-4, "fast dk");
  expect_close(fast.dv.f32(), gv, 1e-5, 1e-4, "fast dv");
}

template <class Elem>
void expect_same_for_1_and_2_threads() {
  const Shape s{2, 150, 4, 2, 64};
  const Case c(s, 1234, true);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run_fast<Elem>(c);
  omp_set_num_threads(2);
  const auto two = run_fast<Elem>(c);
  omp_set_num_threads(saved);
  auto same = [](const auto& a, const auto& b) {
    return std::memcmp(a.v.data(), b.v.data(), a.n * sizeof(a.v[0])) == 0;
  };
  EXPECT_TRUE(same(one.o, two.o)) << "o";
  EXPECT_TRUE(same(one.lse, two.lse)) << "lse";
  EXPECT_TRUE(same(one.dq, two.dq)) << "dq";
  EXPECT_TRUE(same(one.dk, two.dk)) << "dk";
  EXPECT_TRUE(same(one.dv, two.dv)) << "dv";
}

TEST(Attention, F32BitIdenticalAcrossThreadCounts) { expect_same_for_1_and_2_threads<float>(); }
TEST(Attention, Bf16BitIdenticalAcrossThreadCounts) { expect_same_for_1_and_2_threads<bf16>(); }

// cached_attention: the tokens of a case fed in chunks (from position 0, then from the middle),
// each chunk's output against the f64 reference's rows for those positions; the caches end up
// holding k and v and keep their guard elements; cache positions past the chunk stay untouched.
template <class Elem>
void expect_cached_matches_reference(double tol) {
  const Shape s{2, 29, 4, 2, 16};
  const bool bf = !std::is_same_v<Elem, float>;
  const Case c(s, 77, bf);
  const RefOut want = run_ref(c);
  const int64_t S = 32, qrow = s.NH * s.HS, kvrow = s.NKV * s.HS;
  Buf<Elem> kc(s.B * S * kvrow), vc(s.B * S * kvrow);
  std::fill(kc.v.begin(), kc.v.begin() + kc.n, from<Elem>({7.f}).v[0]);  // "unwritten" marker
  std::fill(vc.v.begin(), vc.v.begin() + vc.n, from<Elem>({7.f}).v[0]);
  // (start, tokens)
  const std::pair<int64_t, int64_t> chunks[] = {{0, 5}, {5, 1}, {6, 11}, {17, 1}, {18, 11}};
  for (auto [start, n] : chunks) {
    // this chunk's rows of q, k, v, per sequence
    auto rows = [&](const std::vector<float>& x, int64_t row) {
      std::vector<float> r;
      for (int64_t b = 0; b < s.B; ++b)
        r.insert(r.end(), x.begin() + (b * s.T + start) * row,
                 x.begin() + (b * s.T + start + n) * row);
      return r;
    };
    auto q = from<Elem>(rows(c.q, qrow)), k = from<Elem>(rows(c.k, kvrow)),
         v = from<Elem>(rows(c.v, kvrow));
    Buf<Elem> o(s.B * n * qrow);
    cached_attention<Elem>(q.data(), k.data(), v.data(), kc.data(), vc.data(), o.data(), s.B, n, S,
                           start, s.NH, s.NKV, s.HS, c.scale);
    std::vector<double> o_want;
    for (int64_t b = 0; b < s.B; ++b)
      o_want.insert(o_want.end(), want.o.begin() + (b * s.T + start) * qrow,
                    want.o.begin() + (b * s.T + start + n) * qrow);
    const std::string what =
        "start " + std::to_string(start) + ", " + std::to_string(n) + " tokens";
    expect_close(o.f32(), o_want, tol, tol, what + ": o");
    EXPECT_TRUE(o.guards_intact() && kc.guards_intact() && vc.guards_intact()) << what;
    const auto kf = kc.f32();
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = start + n; t < S; ++t)
        ASSERT_EQ(kf[size_t((b * S + t) * kvrow)], 7.f) << what << ": cache position " << t;
  }
  // the caches hold every token's k and v
  const auto kf = kc.f32(), vf = vc.f32();
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.T * kvrow; ++i) {
      ASSERT_EQ(kf[size_t(b * S * kvrow + i)], c.k[size_t(b * s.T * kvrow + i)]);
      ASSERT_EQ(vf[size_t(b * S * kvrow + i)], c.v[size_t(b * s.T * kvrow + i)]);
    }
  // past the cache: an error, nothing written
  EXPECT_THROW(cached_attention<Elem>(kc.data(), kc.data(), vc.data(), kc.data(), vc.data(),
                                      kc.data(), 1, 4, S, S - 3, s.NH, s.NKV, s.HS, c.scale),
               Error);
}

TEST(CachedAttention, F32MatchesReference) { expect_cached_matches_reference<float>(1e-5); }
// bf16 inputs, f32 arithmetic, the output rounded to bf16
TEST(CachedAttention, Bf16MatchesReference) { expect_cached_matches_reference<bf16>(1e-2); }

}  // namespace
}  // namespace loom::kernels::cpu
