// Distributed parity under the local backend: every tactic's N-rank run (ranks as threads) gives the
// losses, gradients and parameters of the 1-rank run of the same config (f32: within 1e-5 relative).
//
// Each case trains 20 AdamW steps (with clipping, weight decay and a changing lr) of the tiny Llama
// (or a mid-size one) from the same random init on the same batches, then compares every step's loss
// (1e-5 relative), the final parameters and both AdamW moments (gathered from the ranks' blocks), and
// in a separate pass every parameter's gradient after one step (1e-4 relative + 1e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <random>

#include "loom/comm/local.h"
#include "loom/core/error.h"
#include "loom/runtime/collectives.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/step.h"

namespace loom::train {
namespace {

struct Case {
  std::string name, mesh, tactics;
  std::string model = "tiny";  // tiny | mid
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

Config config(const Case& c) {
  std::vector<std::string> sets = {"plan.mesh=" + c.mesh, "plan.tactics=" + c.tactics,
                                   "train.batch_size=4", "train.seq_len=16",
                                   // see expect_close_norm: fewer gradients near eps
                                   "optim.eps=1e-6"};
  if (c.model == "mid")
    for (std::string s : {"model.d_model=128", "model.n_heads=8", "model.n_kv_heads=4",
                          "model.ffn_hidden=352", "model.n_layers=3", "model.vocab_size=512"})
      sets.push_back(s);
  return load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml", sets);
}

std::vector<int32_t> batch(const Config& c, int64_t step) {
  std::mt19937 rng(uint32_t(7919 * step + 3));
  std::uniform_int_distribution<int32_t> u(0, int32_t(c.model.vocab_size - 1));
  std::vector<int32_t> t(size_t(c.train.batch_size * (c.train.seq_len + 1)));
  for (auto& x : t) x = u(rng);
  return t;
}

const int kSteps = std::getenv("PARITY_STEPS") ? std::atoi(std::getenv("PARITY_STEPS")) : 20;
double lr_at(int64_t s) { return 3e-3 * (1.0 - 0.03 * double(s)); }

struct TrainRun {
  std::vector<float> losses, grad_norms;
  std::map<std::string, std::vector<float>> params, m, v;
};

TrainRun train_run(const Config& cfg, const runtime::MeshComms* comms) {
  ParamStore p(cfg.model);
  p.init_random(11);
  StepRunner r(cfg, p, StepRunner::Mode::train, comms);
  TrainRun out;
  for (int64_t s = 1; s <= kSteps; ++s) {
    out.losses.push_back(r.step(batch(cfg, s).data(), lr_at(s)));
    out.grad_norms.push_back(r.grad_norm());
  }
  r.push_params();
  for (const auto& info : p.infos()) {
    const float* d = p.data(info.name);
    out.params[info.name].assign(d, d + numel(info.shape));
    for (int which : {0, 1}) {
      auto& dst = (which == 0 ? out.m : out.v)[info.name];
      dst.resize(size_t(numel(info.shape)));
      r.read_moment(info.name, which, dst.data());
    }
  }
  return out;
}

std::map<std::string, std::vector<float>> grads_run(const Config& cfg,
                                                    const runtime::MeshComms* comms) {
  ParamStore p(cfg.model);
  p.init_random(5);
  StepRunner r(cfg, p, StepRunner::Mode::grads, comms);
  r.step(batch(cfg, 1).data());
  std::map<std::string, std::vector<float>> g;
  for (const auto& info : p.infos()) g[info.name] = r.full_grad(info.name);
  return g;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::abs(double(a[i]) - double(b[i])) - atol - rtol * std::abs(double(b[i]));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, 0) << what << "[" << at << "]: " << a[at] << " vs " << b[at];
}

// ||a - b|| / ||b||: for parameters and moments after 20 AdamW steps, whose elements with a gradient
// near AdamW's eps move by up to ~lr/100 when a split changes the order of a sum (a 1-ulp change in
// a tiny gradient). A misplaced block or a stale shard moves the norm by O(1).
void expect_close_norm(const std::vector<float>& a, const std::vector<float>& b, double rel,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  EXPECT_LE(std::sqrt(d), rel * std::sqrt(n) + 1e-30) << what << ": relative error "
                                                       << std::sqrt(d / std::max(n, 1e-300));
}

// Runs fn on every rank of the plan's mesh (threads) and returns rank 0's result.
template <class T>
T on_ranks(const Config& cfg, const std::function<T(const runtime::MeshComms&)>& fn) {
  T result{};
  std::mutex mu;
  comm::run_local(int(cfg.plan.plan.mesh.size()), [&](comm::Communicator& c) {
    runtime::MeshComms mc(c, cfg.plan.plan.mesh.axes());
    T r = fn(mc);
    std::lock_guard<std::mutex> lock(mu);
    if (c.rank() == 0) result = std::move(r);
  });
  return result;
}

class PlanParity : public ::testing::TestWithParam<Case> {};

TEST_P(PlanParity, TrainingMatchesOneRank) {
  Config cfg = config(GetParam());
  Config single = cfg;
  single.plan = {};
  TrainRun ref = train_run(single, nullptr);
  TrainRun got = on_ranks<TrainRun>(cfg, [&](const runtime::MeshComms& mc) { return train_run(cfg, &mc); });
  expect_close(got.losses, ref.losses, 1e-5, 0, "loss");
  expect_close(got.grad_norms, ref.grad_norms, 1e-4, 0, "grad_norm");
  for (const auto& [name, want] : ref.params) {
    expect_close(got.params.at(name), want, 0, 1e-4, "param " + name);
    expect_close_norm(got.params.at(name), want, 1e-4, "param " + name);
    expect_close_norm(got.m.at(name), ref.m.at(name), 1e-3, "adam.m " + name);
    expect_close_norm(got.v.at(name), ref.v.at(name), 1e-3, "adam.v " + name);
  }
}

TEST_P(PlanParity, GradientsMatchOneRank) {
  Config cfg = config(GetParam());
  Config single = cfg;
  single.plan = {};
  auto ref = grads_run(single, nullptr);
  auto got = on_ranks<std::map<std::string, std::vector<float>>>(
      cfg, [&](const runtime::MeshComms& mc) { return grads_run(cfg, &mc); });
  for (const auto& [name, want] : ref) expect_close(got.at(name), want, 1e-4, 1e-7, "grad " + name);
}

const char* kData = R"([{kind="data",axis="data"}])";
INSTANTIATE_TEST_SUITE_P(
    Tactics, PlanParity,
    ::testing::Values(
        Case{"data", "{data=2}", kData}, Case{"data4", "{data=4}", kData},
        Case{"fsdp", "{data=2}", R"([{kind="fsdp",axis="data"},{kind="data",axis="data"}])"},
        Case{"zero1", "{data=2}", R"([{kind="zero1",axis="data"},{kind="data",axis="data"}])"},
        Case{"zero2", "{data=2}", R"([{kind="zero2",axis="data"},{kind="data",axis="data"}])"},
        Case{"megatron", "{model=2}", R"([{kind="megatron",axis="model"}])"},
        Case{"megatron_sequence", "{model=2}",
             R"([{kind="megatron",axis="model"},{kind="sequence",axis="model"}])"},
        Case{"fsdp_megatron_2x2", "{data=2,model=2}",
             R"([{kind="megatron",axis="model"},{kind="fsdp",axis="data"},{kind="data",axis="data"}])"},
        Case{"shard_lm_head", "{model=2}",
             R"([{kind="shard",axis="model",pattern="lm_head.weight",dim=0}])"},
        Case{"mid_fsdp_megatron_2x2", "{data=2,model=2}",
             R"([{kind="megatron",axis="model"},{kind="fsdp",axis="data"},{kind="data",axis="data"}])",
             "mid"},
        Case{"mid_megatron_sequence", "{model=2}",
             R"([{kind="megatron",axis="model"},{kind="sequence",axis="model"}])", "mid"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::train
