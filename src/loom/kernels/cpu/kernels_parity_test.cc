// Thread-count parity: every kernel with a reduction gives bit-identical results with 1, 2 and 3
// OpenMP threads (the invariant stated in kernels.h, which distributed parity tests build on).
//
// Not here: accuracy (kernels_test.cc).
// Invariant: sizes are chosen so every kernel splits into many blocks, so the threads really do
// share the work; 3 threads checks an uneven split.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {
namespace {

constexpr uint32_t kSeed = 7;

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
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

// Runs `run` (which fills `outs`) with 1, 2 and 3 threads; every output must match the 1-thread
// bits.
void expect_thread_parity(const char* what, std::vector<std::vector<float>*> outs,
                          const std::function<void()>& run) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  run();
  std::vector<std::vector<float>> first;
  for (auto* o : outs) first.push_back(*o);
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    for (auto* o : outs) std::fill(o->begin(), o->end(), -1.0f);
    run();
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_EQ(0, std::memcmp(first[i].data(), outs[i]->data(), first[i].size() * 4))
          << what << ": output " << i << " differs between 1 and " << threads << " threads";
  }
  omp_set_num_threads(saved);
}

TEST(KernelsParity, EmbeddingBwd) {
  const int64_t N = 3000, V = 50, C = 333;  // 6 column blocks, every id repeated ~60 times
  auto ids = rand_ids(N, int32_t(V), kSeed);
  auto dout = randn(N * C, kSeed + 1);
  std::vector<float> dtable(V * C);
  expect_thread_parity("embedding_bwd", {&dtable},
                       [&] { embedding_bwd(ids.data(), dout.data(), dtable.data(), N, V, C); });
}

// Mixture-of-Experts: the router's sums over tokens, its slots, and dispatch/combine/gate_grad
// (integer outputs compared through their float bits as well).
TEST(KernelsParity, MoeRouting) {
  const int64_t B = 6, T = 700, E = 8, K = 2, S = 150, C = 40;  // many token blocks, some drops
  auto logits = randn(B * T * E, kSeed), x = randn(B * T * C, kSeed + 1);
  auto dgates = randn(B * T * K, kSeed + 2), dps = randn(E, kSeed + 3);
  std::vector<float> gates(B * T * K), ps(E), z(1), routed(E), kept(E), dl(B * T * E);
  std::vector<float> experts_bits(B * T * K), slots_bits(B * T * K);
  std::vector<float> xe(E * B * S * C), y(B * T * C), dg(B * T * K);
  std::vector<int32_t> experts(B * T * K), slots(B * T * K);
  expect_thread_parity(
      "moe", {&gates, &ps, &z, &routed, &kept, &dl, &experts_bits, &slots_bits, &xe, &y, &dg}, [&] {
        moe_router(logits.data(), gates.data(), experts.data(), slots.data(), ps.data(), z.data(),
                   routed.data(), kept.data(), B, T, E, K, S);
        std::memcpy(experts_bits.data(), experts.data(), experts.size() * 4);
        std::memcpy(slots_bits.data(), slots.data(), slots.size() * 4);
        moe_router_bwd(logits.data(), gates.data(), experts.data(), dgates.data(), dps.data(), 0.5f,
                       dl.data(), B, T, E, K);
        moe_dispatch<float>(x.data(), experts.data(), slots.data(), gates.data(), xe.data(), B, T,
                            C, E, K, S);
        moe_combine<float>(xe.data(), experts.data(), slots.data(), gates.data(), y.data(), B, T, C,
                           E, K, S);
        moe_gate_grad<float, float>(xe.data(), y.data(), experts.data(), slots.data(), dg.data(), B,
                                    T, C, E, K, S);
      });
  EXPECT_LT(kept[0] + kept[1] + kept[2] + kept[3] + kept[4] + kept[5] + kept[6] + kept[7],
            float(B * T * K))
      << "the case should drop some choices";
}

TEST(KernelsParity, RmsNormBwd) {
  const int64_t N = 1000, C = 77;  // 16 row blocks
  auto x = randn(N * C, kSeed), w = randn(C, kSeed + 1), dy = randn(N * C, kSeed + 2);
  std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C);
  expect_thread_parity("rmsnorm", {&y, &rstd, &dx, &dw}, [&] {
    rmsnorm_fwd(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-5f);
    rmsnorm_bwd(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), N, C);
  });
}

TEST(KernelsParity, LayerNormBwd) {
  const int64_t N = 1000, C = 77;
  auto x = randn(N * C, kSeed), w = randn(C, kSeed + 1), b = randn(C, kSeed + 3);
  auto dy = randn(N * C, kSeed + 2);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  expect_thread_parity("layernorm", {&y, &mean, &rstd, &dx, &dw, &db}, [&] {
    layernorm_fwd(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5f);
    layernorm_bwd(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                  db.data(), N, C);
  });
}

TEST(KernelsParity, SumSumsqSumRows) {
  const int64_t n = 1000003;  // 62 element blocks and a partial one
  auto x = randn(n, kSeed);
  std::vector<float> s(1), ss(1);
  expect_thread_parity("sum/sumsq", {&s, &ss}, [&] {
    sum(x.data(), s.data(), n);
    sumsq(x.data(), ss.data(), n);
  });
  const int64_t N = 1001, C = 999;  // 16 row blocks; C over one column block of sum_partials
  std::vector<float> y(C);
  expect_thread_parity("sum_rows", {&y}, [&] { sum_rows(x.data(), y.data(), N, C); });
}

TEST(KernelsParity, CrossEntropy) {
  const int64_t N = 67, V = 1000;
  auto logits = randn(N * V, kSeed, 4.0f);
  auto targets = rand_ids(N, int32_t(V), kSeed + 1);
  std::vector<float> loss(1), dlogits(N * V);
  expect_thread_parity("cross_entropy", {&loss, &dlogits}, [&] {
    cross_entropy(logits.data(), targets.data(), loss.data(), dlogits.data(), N, V);
  });
}

TEST(KernelsParity, ElementwiseAndAdamW) {
  const int64_t n = 100003;
  auto g = randn(n, kSeed), u = randn(n, kSeed + 1), p0 = randn(n, kSeed + 2);
  std::vector<float> y(n), dg(n), du(n), p(n), m(n), v(n);
  expect_thread_parity("activations", {&y, &dg, &du}, [&] {
    swiglu_fwd(g.data(), u.data(), y.data(), n);
    swiglu_bwd(p0.data(), g.data(), u.data(), dg.data(), du.data(), n);
  });
  const float hyper[3] = {1e-3f, 0.1f, 0.05f}, gscale = 0.5f;
  expect_thread_parity("adamw", {&p, &m, &v}, [&] {
    p = p0;
    std::fill(m.begin(), m.end(), 0.0f);
    std::fill(v.begin(), v.end(), 0.0f);
    for (int step = 0; step < 3; ++step)
      adamw(p.data(), g.data(), m.data(), v.data(), hyper, &gscale, n, 0.9f, 0.95f, 1e-8f, 0.1f);
  });
}

}  // namespace
}  // namespace loom::kernels::cpu
