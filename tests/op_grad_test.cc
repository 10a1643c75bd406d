// The op harness: for every differentiable op, one small graph with awkward shapes.
//   forward:  the executor's f32 output against the f64 reference interpreter;
//   backward: gradients from autodiff (the op's VJP, run by the executor's f32 kernels) against
//   central
//             finite differences of the f64 reference, on loss = sum_i sum(out_i * R_i) with random
//             R.
// Tolerances are per case: |analytic - fd| <= atol + rtol * |fd|; the worst element is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "loom/autodiff/autodiff.h"
#include "loom/ops/builder.h"
#include "loom/runtime/executor.h"
#include "op_cases.h"
#include "reference_eval.h"

namespace loom {
namespace {

using ir::TensorType;
using ir::ValueKind;

class OpGrad : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpGrad, ForwardAndFiniteDifferences) {
  const OpCase& c = GetParam();
  const uint32_t seed = 1234;
  std::printf("case %s seed %u\n", c.name.c_str(), seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);

  Harness h = build_harness(c);
  ir::Graph& g = h.g;
  const std::vector<int>& outs = h.outs;
  const std::vector<int>& params = h.params;
  const int loss = h.loss;
  auto& grads = h.grads;

  // Inputs: f32 values (exactly representable, so f32 and f64 see the same numbers).
  std::map<int, std::vector<float>> f32_in;
  std::map<int, std::vector<int32_t>> i32_in;
  std::map<int, std::vector<double>> f64_in;
  for (const ir::Value& v : g.values()) {
    if (v.kind == ValueKind::node) continue;
    size_t n = size_t(numel(v.type.shape));
    if (v.type.dtype == DType::i32) {
      std::uniform_int_distribution<int32_t> u(0, c.id_range - 1);
      auto& d = i32_in[v.id];
      for (size_t i = 0; i < n; ++i) d.push_back(u(rng));
      f64_in[v.id].assign(d.begin(), d.end());
    } else {
      auto& d = f32_in[v.id];
      for (size_t i = 0; i < n; ++i) d.push_back(nd(rng));
      f64_in[v.id].assign(d.begin(), d.end());
    }
  }
  runtime::Executor ex(g);
  for (auto& [id, d] : f32_in) ex.bind(id, d.data());
  for (auto& [id, d] : i32_in) ex.bind(id, d.data());
  ex.run();

  // Forward.
  const int forward_end = h.forward_end;
  auto ref = testing::eval_f64(g, f64_in, forward_end);
  for (int o : outs) {
    const ir::Value& v = g.value(o);
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < ref[o].size(); ++i) scale = std::max(scale, std::abs(ref[o][i]));
    for (size_t i = 0; i < ref[o].size(); ++i) {
      double a = v.type.dtype == DType::f32 ? ex.ptr<float>(o)[i] : bf16_to_f32(ex.ptr<bf16>(o)[i]);
      worst = std::max(worst, std::abs(a - ref[o][i]) / scale);
    }
    EXPECT_LE(worst, c.fwd_tol) << c.name << ": forward %" << v.name << " max error / max |ref|";
  }

  // Backward against central differences of the f64 reference.
  auto loss_at = [&](const std::map<int, std::vector<double>>& in) {
    return testing::eval_f64(g, in, forward_end)[loss][0];
  };
  for (int p : params) {
    const float* an = ex.ptr<float>(grads[p]);
    size_t n = f64_in[p].size();
    std::vector<size_t> idx;
    if (n <= 48) {
      for (size_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      std::uniform_int_distribution<size_t> u(0, n - 1);
      idx = {0, n - 1};
      for (int i = 0; i < 46; ++i) idx.push_back(u(rng));
    }
    double worst = -1, worst_a = 0, worst_f = 0;
    size_t worst_i = 0;
    bool ok = true;
    for (size_t i : idx) {
      auto in = f64_in;
      double x = in[p][i], h = 1e-5 * std::max(1.0, std::abs(x));
      in[p][i] = x + h;
      double lp = loss_at(in);
      in[p][i] = x - h;
      double lm = loss_at(in);
      double fd = (lp - lm) / (2 * h);
      double err = std::abs(an[i] - fd), bound = c.atol + c.rtol * std::abs(fd);
      if (err > bound) ok = false;
      if (err / bound > worst) {
        worst = err / bound;
        worst_i = i;
        worst_a = an[i];
        worst_f = fd;
      }
    }
    EXPECT_TRUE(ok) << c.name << ": d loss / d %" << g.value(p).name << " worst at [" << worst_i
                    << "]: analytic " << worst_a << " vs finite difference " << worst_f
                    << " (error/bound " << worst << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpGrad, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom
