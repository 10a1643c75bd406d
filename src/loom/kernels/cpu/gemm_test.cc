// gemm (oneDNN) against gemm_ref (triple loop in double) on every layout, dtype and accumulate
// mode.
//
// Inputs are uniform in [-1,1] from a fixed seed (printed on failure through the desc trace),
// rounded to bf16 first when the inputs are bf16, so both sides multiply the same numbers. C is
// guarded by bytes on both sides that must stay untouched, and when not accumulating it starts as
// NaN, which would leak into the result if the GEMM read it.
//
// Tolerance: |gemm - ref| <= atol + rtol * |ref| with atol = K * 2^-22 (f32 accumulation of K
// products of magnitude <= 1) and rtol = 1e-5 for an f32 C, 2^-7 for a bf16 C: one bf16 ulp
// relative to the value, since gemm rounds its f32 sum and gemm_ref its f64 sum, and a near-tie may
// go either way (about 1 element in 20,000 at K = 520).
#include "loom/kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

namespace loom::kernels::cpu {
namespace {

constexpr uint32_t kSeed = 20240611;
constexpr size_t kGuard = 64;  // bytes each side of C
constexpr unsigned char kGuardByte = 0xA5;

// A typed buffer with guard bytes around it.
struct Buffer {
  DType dtype;
  int64_t n;
  std::vector<unsigned char> bytes;

  Buffer(DType t, int64_t count)
      : dtype(t), n(count), bytes(2 * kGuard + count * dtype_size(t), kGuardByte) {}
  void* data() { return bytes.data() + kGuard; }
  double get(int64_t i) const {
    const unsigned char* p = bytes.data() + kGuard;
    if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    bf16 h;
    std::memcpy(&h, p + 2 * i, 2);
    return bf16_to_f32(h);
  }
  void set(int64_t i, float v) {
    unsigned char* p = bytes.data() + kGuard;
    if (dtype == DType::f32) {
      std::memcpy(p + 4 * i, &v, 4);
    } else {
      const bf16 h = f32_to_bf16(v);
      std::memcpy(p + 2 * i, &h, 2);
    }
  }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (bytes[i] != kGuardByte || bytes[bytes.size() - 1 - i] != kGuardByte) return false;
    }
    return true;
  }
};

void fill_uniform(Buffer& b, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < b.n; ++i) b.set(i, u(rng));
}

// Runs gemm and gemm_ref on the same inputs and checks every element of C.
void check_against_ref(const GemmDesc& d) {
  std::ostringstream trace;
  trace << d << " seed=" << kSeed << " threads=" << omp_get_max_threads();
  SCOPED_TRACE(trace.str());
  std::mt19937 rng(kSeed);
  Buffer a(d.ab_dtype, d.batch * d.M * d.K), b(d.ab_dtype, d.batch * d.K * d.N);
  Buffer c(d.c_dtype, d.batch * d.M * d.N), c_ref(d.c_dtype, d.batch * d.M * d.N);
  fill_uniform(a, rng);
  fill_uniform(b, rng);
  if (d.accumulate) {
    fill_uniform(c, rng);
  } else {
    for (int64_t i = 0; i < c.n; ++i) c.set(i, std::numeric_limits<float>::quiet_NaN());
  }
  c_ref.bytes = c.bytes;

  gemm(d, a.data(), b.data(), c.data());
  gemm_ref(d, a.data(), b.data(), c_ref.data());

  EXPECT_TRUE(c.guards_intact()) << "gemm wrote outside C";
  const double atol = d.K * std::ldexp(1.0, -22);
  const double rtol = d.c_dtype == DType::f32 ? 1e-5 : std::ldexp(1.0, -7);
  int64_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (int64_t i = 0; i < c.n; ++i) {
    const double got = c.get(i), ref = c_ref.get(i);
    const double excess = std::abs(got - ref) - (atol + rtol * std::abs(ref));
    if (!(excess <= 0)) ++bad;  // also counts NaN
    if (!(excess <= worst_excess)) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << c.n << " elements out of tolerance; worst at flat index "
                    << worst << ": gemm=" << c.get(worst) << " ref=" << c_ref.get(worst)
                    << " (atol=" << atol << " rtol=" << rtol << ")";
}

struct DTypes {
  DType ab, c;
};
constexpr DTypes kDTypes[] = {
    {DType::f32, DType::f32}, {DType::bf16, DType::f32}, {DType::bf16, DType::bf16}};

// Every combination of ta, tb, batch in {1,3}, accumulate and dtypes for one (M,N,K).
void check_all_combinations(int64_t M, int64_t N, int64_t K,
                            std::initializer_list<int64_t> batches) {
  for (const DTypes& t : kDTypes) {
    for (int64_t batch : batches) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          for (int acc = 0; acc < 2; ++acc) {
            GemmDesc d;
            d.batch = batch;
            d.M = M;
            d.N = N;
            d.K = K;
            d.ta = ta;
            d.tb = tb;
            d.ab_dtype = t.ab;
            d.c_dtype = t.c;
            d.accumulate = acc;
            check_against_ref(d);
          }
        }
      }
    }
  }
}

TEST(Gemm, OddSizesAllCombinations) { check_all_combinations(7, 13, 33, {1, 3}); }

TEST(Gemm, VectorShapes) {
  check_all_combinations(1, 17, 40, {1, 3});  // a row vector times a matrix
  check_all_combinations(19, 1, 40, {1});     // a matrix times a column vector
  check_all_combinations(5, 6, 1, {1});       // outer product
}

// One row times a weight goes to gemv (gemv.h): several blocks of its rows (64) and of
// its columns (256), a tail of K past 16 lanes and of N past the four rows done at once; its
// results are the same bits whatever the thread count.
TEST(Gemm, RowTimesWeight) {
  check_all_combinations(1, 517, 600, {1});
  check_all_combinations(1, 3, 15, {1});
  const int saved = omp_get_max_threads();
  for (int tb = 0; tb < 4; ++tb) {
    const GemmDesc d{.M = 1,
                     .N = 517,
                     .K = 600,
                     .tb = bool(tb % 2),
                     .ab_dtype = tb < 2 ? DType::bf16 : DType::f32};
    std::mt19937 rng(kSeed);
    Buffer a(d.ab_dtype, d.K), b(d.ab_dtype, d.K * d.N), c1(d.c_dtype, d.N), c2(d.c_dtype, d.N);
    fill_uniform(a, rng);
    fill_uniform(b, rng);
    omp_set_num_threads(1);
    gemm(d, a.data(), b.data(), c1.data());
    omp_set_num_threads(2);
    gemm(d, a.data(), b.data(), c2.data());
    EXPECT_EQ(c1.bytes, c2.bytes) << "variant " << tb;
  }
  omp_set_num_threads(saved);
}

// Big enough for oneDNN's blocked kernels, with tails in every dimension.
TEST(Gemm, BigAllCombinations) { check_all_combinations(257, 300, 520, {1}); }

TEST(Gemm, BigBatched) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      GemmDesc d{.batch = 3, .M = 130, .N = 96, .K = 200, .ab_dtype = DType::bf16};
      d.ta = ta;
      d.tb = tb;
      d.accumulate = true;
      check_against_ref(d);
    }
  }
}

// The second call with the same desc comes from the cache and must use the new pointers.
TEST(Gemm, CachedPrimitiveUsesNewPointers) {
  const GemmDesc d{.M = 8, .N = 8, .K = 8, .tb = true};
  std::vector<float> a(64, 1.f), b(64, 2.f), c(64), a2(64, 3.f), b2(64, 0.5f), c2(64);
  gemm(d, a.data(), b.data(), c.data());
  gemm(d, a2.data(), b2.data(), c2.data());
  EXPECT_EQ(c[0], 16.f);
  EXPECT_EQ(c2[63], 12.f);
  EXPECT_EQ(c[63], 16.f) << "the second call wrote into the first call's C";
}

// The cache is keyed by the thread count too: a primitive made for 2 threads is not run on 1.
TEST(Gemm, ThreadCountChange) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 1}) {
    omp_set_num_threads(threads);
    check_against_ref({.M = 64, .N = 96, .K = 128, .tb = true, .ab_dtype = DType::bf16});
  }
  omp_set_num_threads(saved);
}

TEST(Gemm, RepeatedCallsAreBitIdentical) {
  const GemmDesc d{.M = 100, .N = 70, .K = 300, .ta = true, .ab_dtype = DType::bf16};
  std::mt19937 rng(kSeed);
  Buffer a(d.ab_dtype, d.M * d.K), b(d.ab_dtype, d.K * d.N), c1(d.c_dtype, d.M * d.N),
      c2(d.c_dtype, d.M * d.N);
  fill_uniform(a, rng);
  fill_uniform(b, rng);
  gemm(d, a.data(), b.data(), c1.data());
  gemm(d, a.data(), b.data(), c2.data());
  EXPECT_EQ(c1.bytes, c2.bytes);
}

TEST(Gemm, EmptyK) {
  GemmDesc d{.M = 2, .N = 3, .K = 0};
  std::vector<float> c(6, 5.f);
  gemm(d, nullptr, nullptr, c.data());
  EXPECT_EQ(c, std::vector<float>(6, 0.f));
  d.accumulate = true;
  c.assign(6, 5.f);
  gemm(d, nullptr, nullptr, c.data());
  EXPECT_EQ(c, std::vector<float>(6, 5.f));
}

TEST(Gemm, DescPrints) {
  std::ostringstream os;
  os << GemmDesc{.M = 7, .N = 13, .K = 33, .tb = true, .ab_dtype = DType::bf16};
  EXPECT_EQ(os.str(), "gemm{batch=1 M=7 N=13 K=33 ta=0 tb=1 ab=bf16 c=f32 accumulate=0}");
}

TEST(GemmDeathTest, BadDescAbortsWithDesc) {
  const GemmDesc d{.M = 2, .N = 2, .K = 2, .ab_dtype = DType::i32};
  int32_t x[4] = {};
  EXPECT_DEATH(gemm(d, x, x, x), "internal check failed.*ab=i32");
  const GemmDesc f32_to_bf16_c{.M = 2, .N = 2, .K = 2, .c_dtype = DType::bf16};
  EXPECT_DEATH(gemm(f32_to_bf16_c, x, x, x), "bf16 C needs bf16 inputs");
}

}  // namespace
}  // namespace loom::kernels::cpu
