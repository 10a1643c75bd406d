// The op harness: for every differentiable op, one small graph with awkward shapes.
//   forward:  the executor's f32 output against the f64 reference interpreter;
//   backward: gradients from autodiff (the op's VJP, run by the executor's f32 kernels) against central
//             finite differences of the f64 reference, on loss = sum_i sum(out_i * R_i) with random R.
// Tolerances are per case: |analytic - fd| <= atol + rtol * |fd|; the worst element is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "loom/autodiff/autodiff.h"
#include "loom/ops/builder.h"
#include "loom/runtime/executor.h"
#include "reference_eval.h"

namespace loom {
namespace {

using ir::TensorType;
using ir::ValueKind;

struct OpCase {
  std::string name;
  std::function<std::vector<int>(ir::Graph&, ops::Builder&)> build;
  double rtol = 2e-3, atol = 2e-4;
  int id_range = 0;  // i32 inputs are drawn from [0, id_range)
  double fwd_tol = 1e-5;  // forward: max |out - ref| / max |ref|
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

class OpGrad : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpGrad, ForwardAndFiniteDifferences) {
  const OpCase& c = GetParam();
  const uint32_t seed = 1234;
  std::printf("case %s seed %u\n", c.name.c_str(), seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);

  ir::Graph g("op_" + c.name);
  ops::Builder b(g);
  std::vector<int> outs = c.build(g, b);
  int loss = -1;
  std::vector<int> rs;
  for (size_t i = 0; i < outs.size(); ++i) {
    int o = b.cast(outs[i], DType::f32);
    int r = g.add_input("r" + std::to_string(i), {DType::f32, b.shape(o)}, ValueKind::state);
    rs.push_back(r);
    int s = b.emit1("sum", {b.mul(o, r)});
    loss = loss < 0 ? s : b.add(loss, s);
  }
  std::vector<int> params = g.inputs_of_kind(ValueKind::param);
  auto grads = autodiff::gradients(b, loss, params);
  g.add_output(loss);
  for (int o : outs) g.add_output(o);
  for (auto [p, d] : grads) g.add_output(d);

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
  const int forward_end = g.value(loss).producer;
  auto ref = testing::eval_f64(g, f64_in, forward_end);
  for (int o : outs) {
    const ir::Value& v = g.value(o);
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < ref[o].size(); ++i) scale = std::max(scale, std::abs(ref[o][i]));
    for (size_t i = 0; i < ref[o].size(); ++i) {
      double a = v.type.dtype == DType::f32 ? ex.ptr<float>(o)[i]
                                            : bf16_to_f32(ex.ptr<bf16>(o)[i]);
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

int P(ir::Graph& g, const std::string& name, Shape s) {
  return g.add_input(name, {DType::f32, s}, ValueKind::param);
}
int Ids(ir::Graph& g, const std::string& name, Shape s) {
  return g.add_input(name, {DType::i32, s}, ValueKind::input);
}

std::vector<OpCase> cases() {
  std::vector<OpCase> v;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      v.push_back({"matmul_ta" + std::to_string(ta) + "_tb" + std::to_string(tb),
                   [ta, tb](ir::Graph& g, ops::Builder& b) {
                     // 3-D a: (2,3,5) viewed as rows; contraction dim 5 (or 6 when ta)
                     int a = ta ? P(g, "a", {2, 3, 5}) : P(g, "a", {2, 3, 5});
                     int bb = ta ? (tb ? P(g, "b", {4, 6}) : P(g, "b", {6, 4}))
                                 : (tb ? P(g, "b", {4, 5}) : P(g, "b", {5, 4}));
                     return std::vector<int>{b.matmul(a, bb, ta, tb)};
                   }});
    }
  v.push_back({"matmul_batched", [](ir::Graph& g, ops::Builder& b) {
                 int a = P(g, "a", {3, 4, 5}), bb = P(g, "b", {3, 6, 5});
                 return std::vector<int>{
                     b.emit1("matmul", {a, bb}, {{"tb", int64_t(1)}, {"batch", int64_t(1)}})};
               }});
  v.push_back({"add", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.add(P(g, "a", {3, 7}), P(g, "b", {3, 7}))};
               }});
  v.push_back({"add_bias", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.add(P(g, "a", {2, 3, 7}), P(g, "b", {7}))};
               }});
  v.push_back({"mul", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.mul(P(g, "a", {5, 3}), P(g, "b", {5, 3}))};
               }});
  v.push_back({"scale", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.scale(P(g, "a", {9}), -0.75)};
               }});
  v.push_back({"mul_scalar", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("mul_scalar", {P(g, "a", {4, 5}), P(g, "s", {})})};
               }});
  v.push_back({"gelu", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("gelu", {P(g, "x", {3, 17})})};
               }});
  v.push_back({"swiglu", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("swiglu", {P(g, "g", {3, 17}), P(g, "u", {3, 17})})};
               }});
  v.push_back({"swiglu_bf16",
               [](ir::Graph& g, ops::Builder& b) {
                 int gg = b.cast(P(g, "g", {3, 17}), DType::bf16);
                 int u = b.cast(P(g, "u", {3, 17}), DType::bf16);
                 return std::vector<int>{b.emit1("swiglu", {gg, u})};
               },
               3e-2, 3e-2, 0, 1e-2});  // bf16 storage of inputs, output and gradients
  v.push_back({"cast_roundtrip",
               [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.cast(b.cast(P(g, "x", {4, 9}), DType::bf16), DType::f32)};
               },
               1e-2, 1e-2, 0, 4e-3});  // bf16 rounding: 2^-9 relative
  v.push_back({"sum", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("sum", {P(g, "x", {4, 9})})};
               }});
  v.push_back({"sumsq", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("sumsq", {P(g, "x", {4, 9})})};
               }});
  v.push_back({"sum_rows", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("sum_rows", {P(g, "x", {2, 4, 9})})};
               }});
  v.push_back({"broadcast_scalar", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{
                     b.emit1("broadcast_scalar", {P(g, "s", {})}, {{"shape", Shape{3, 4}}})};
               }});
  v.push_back({"broadcast_rows", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{
                     b.emit1("broadcast_rows", {P(g, "v", {5})}, {{"shape", Shape{2, 3, 5}}})};
               }});
  v.push_back({"embedding",
               [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{
                     b.emit1("embedding", {Ids(g, "ids", {2, 9}), P(g, "table", {7, 5})})};
               },
               2e-3, 2e-4, 7});
  v.push_back({"rmsnorm", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit("rmsnorm", {P(g, "x", {2, 3, 33}), P(g, "w", {33})},
                                                {{"eps", 1e-5}})[0]};
               }});
  v.push_back({"layernorm", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{
                     b.emit("layernorm", {P(g, "x", {5, 33}), P(g, "w", {33}), P(g, "b", {33})},
                            {{"eps", 1e-5}})[0]};
               }});
  v.push_back({"rope", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("rope", {P(g, "x", {2, 5, 3, 8})},
                                                 {{"theta", 10000.0}, {"sign", int64_t(1)}})};
               }});
  v.push_back({"attention_gqa", [](ir::Graph& g, ops::Builder& b) {
                 int q = P(g, "q", {2, 7, 4, 8}), k = P(g, "k", {2, 7, 2, 8}),
                     vv = P(g, "v", {2, 7, 2, 8});
                 return std::vector<int>{
                     b.emit("attention", {q, k, vv}, {{"scale", 1.0 / std::sqrt(8.0)}})[0]};
               }});
  v.push_back({"attention_long", [](ir::Graph& g, ops::Builder& b) {
                 int q = P(g, "q", {1, 70, 2, 16}), k = P(g, "k", {1, 70, 1, 16}),
                     vv = P(g, "v", {1, 70, 1, 16});
                 return std::vector<int>{b.emit("attention", {q, k, vv}, {{"scale", 0.25}})[0]};
               }});
  v.push_back({"cross_entropy",
               [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit("cross_entropy",
                                                {P(g, "logits", {2, 3, 11}), Ids(g, "t", {2, 3})})[0]};
               },
               2e-3, 2e-4, 11});
  v.push_back({"reshape", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.reshape(P(g, "x", {2, 6}), {3, 4})};
               }});
  v.push_back({"transpose", [](ir::Graph& g, ops::Builder& b) {
                 return std::vector<int>{b.emit1("transpose", {P(g, "x", {2, 3, 4, 5})},
                                                 {{"perm", std::vector<int64_t>{0, 2, 1, 3}}})};
               }});
  v.push_back({"split_concat", [](ir::Graph& g, ops::Builder& b) {
                 auto parts = b.emit("split", {P(g, "x", {3, 10})},
                                     {{"sizes", std::vector<int64_t>{2, 3, 5}}});
                 int c = b.emit1("concat", {parts[2], P(g, "y", {3, 4}), parts[0]});
                 return std::vector<int>{c, parts[1]};
               }});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpGrad, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom
