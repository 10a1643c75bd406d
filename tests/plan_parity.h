// Shared by plan_parity_test (ranks as threads) and plan_parity_mpi (ranks under mpirun): the
// cases, and the one-rank and N-rank runs they compare.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/runtime/collectives.h"
#include "loom/train/config.h"
#include "loom/train/step.h"

namespace loom::train::parity {

struct Case {
  std::string name, mesh, tactics;
  // tiny | mid (Llama) | gpt2 (the tiny GPT-2) | moe (tiny-moe: top 2, some tokens dropped) |
  // moe_gpt2 (tiny-moe-gpt2: top 1, every second layer) | normformer (tiny-normformer) |
  // normformer_gpt2 (tiny-normformer-gpt2: with MoE layers)
  std::string model = "tiny";
  std::vector<std::string> sets = {};  // more --set overrides ([passes])
};

inline std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

inline Config config(const Case& c) {
  std::vector<std::string> sets = {"plan.mesh=" + c.mesh, "plan.tactics=" + c.tactics,
                                   "train.batch_size=4", "train.seq_len=16",
                                   // see expect_close_norm: fewer gradients near eps
                                   "optim.eps=1e-6"};
  if (c.model == "mid")
    for (std::string s : {"model.d_model=128", "model.n_heads=8", "model.n_kv_heads=4",
                          "model.ffn_hidden=352", "model.n_layers=3", "model.vocab_size=512"})
      sets.push_back(s);
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  const std::map<std::string, const char*> files = {
      {"tiny", "/configs/tiny-llama.toml"},
      {"mid", "/configs/tiny-llama.toml"},
      {"gpt2", "/configs/tiny-gpt2.toml"},
      {"moe", "/configs/tiny-moe.toml"},
      {"moe_gpt2", "/configs/tiny-moe-gpt2.toml"},
      {"normformer", "/configs/tiny-normformer.toml"},
      {"normformer_gpt2", "/configs/tiny-normformer-gpt2.toml"}};
  const char* file = files.at(c.model);
  return load_config(std::string(LOOM_SOURCE_DIR) + file, sets);
}

inline std::vector<int32_t> batch(const Config& c, int64_t step) {
  std::mt19937 rng(uint32_t(7919 * step + 3));
  std::uniform_int_distribution<int32_t> u(0, int32_t(c.model.vocab_size - 1));
  // a step's rows: grad_accum micro-batches of batch_size
  std::vector<int32_t> t(size_t(c.train.batch_size * c.train.grad_accum * (c.train.seq_len + 1)));
  for (auto& x : t) x = u(rng);
  return t;
}

inline const int kSteps = std::getenv("PARITY_STEPS") ? std::atoi(std::getenv("PARITY_STEPS")) : 20;
inline double lr_at(int64_t s) { return 3e-3 * (1.0 - 0.03 * double(s)); }

struct TrainRun {
  std::vector<float> losses, grad_norms;
  std::map<std::string, std::vector<float>> params, m, v;
  int64_t saved_bytes = 0;  // the step's saved activations (StepRunner::activation_bytes)
  int64_t recomputed = 0;   // nodes passes/recompute.cc made again (outputs named *.recompute)
};

// The nodes of a program that [passes] recompute made again for the backward.
inline int64_t recomputed_nodes(const ir::Graph& g) {
  int64_t n = 0;
  for (const ir::Node& node : g.nodes())
    for (int o : node.outputs)
      if (g.value(o).name.find(".recompute") != std::string::npos) {
        ++n;
        break;
      }
  return n;
}

// Every parameter (as `p` holds it) and both AdamW moments (as `r` holds them) into `out`.
inline void read_state(ParamStore& p, StepRunner& r, TrainRun& out) {
  for (const auto& info : p.infos()) {
    const float* d = p.data(info.name);
    out.params[info.name].assign(d, d + numel(info.shape));
    for (autodiff::Moment which : autodiff::kMoments) {
      auto& dst = (which == autodiff::Moment::m ? out.m : out.v)[info.name];
      dst.resize(size_t(numel(info.shape)));
      r.read_moment(info.name, which, dst.data());
    }
  }
}

inline TrainRun train_run(const Config& cfg, const runtime::MeshComms* comms) {
  ParamStore p(cfg.model);
  p.init_random(11);
  StepRunner r(cfg, p, StepRunner::Mode::train, comms);
  TrainRun out;
  out.saved_bytes = r.activation_bytes();
  out.recomputed = recomputed_nodes(r.program());
  for (int64_t s = 1; s <= kSteps; ++s) {
    out.losses.push_back(r.step(batch(cfg, s).data(), lr_at(s)));
    out.grad_norms.push_back(r.grad_norm());
  }
  r.push_params();
  read_state(p, r, out);
  return out;
}

inline std::map<std::string, std::vector<float>> grads_run(const Config& cfg,
                                                           const runtime::MeshComms* comms) {
  ParamStore p(cfg.model);
  p.init_random(5);
  StepRunner r(cfg, p, StepRunner::Mode::grads, comms);
  r.step(batch(cfg, 1).data());
  std::map<std::string, std::vector<float>> g;
  for (const auto& info : p.infos()) g[info.name] = r.full_grad(info.name);
  return g;
}

// "" when every |a - b| <= atol + rtol |b|, else the worst element.
inline std::string close(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                         double atol, const std::string& what) {
  if (a.size() != b.size()) return what + ": sizes differ";
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::abs(double(a[i]) - double(b[i])) - atol - rtol * std::abs(double(b[i]));
    if (err > worst) worst = err, at = i;
  }
  if (worst <= 0) return "";
  return what + "[" + std::to_string(at) + "]: " + std::to_string(a[at]) + " vs " +
         std::to_string(b[at]);
}

// ||a - b|| / ||b||: for parameters and moments after 20 AdamW steps, whose elements with a
// gradient near AdamW's eps move by up to ~lr/100 when a split changes the order of a sum (a 1-ulp
// change in a tiny gradient). A misplaced block or a stale shard moves the norm by O(1).
inline std::string close_norm(const std::vector<float>& a, const std::vector<float>& b, double rel,
                              const std::string& what) {
  if (a.size() != b.size()) return what + ": sizes differ";
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  if (std::sqrt(d) <= rel * std::sqrt(n) + 1e-30) return "";
  return what + ": relative error " + std::to_string(std::sqrt(d / std::max(n, 1e-300)));
}

// Every difference between an N-rank training run and the reference ("" entries dropped).
inline std::vector<std::string> compare_training(const TrainRun& got, const TrainRun& ref) {
  std::vector<std::string> errs{close(got.losses, ref.losses, 1e-5, 0, "loss"),
                                close(got.grad_norms, ref.grad_norms, 1e-3, 0, "grad_norm")};
  // Each parameter element within 3e-4 (lr 1e-3): an element whose gradient is a near-cancelling
  // sum of a few micro (the mid Llama's embedding row 98 under megatron: RMS 6e-6, mean 3e-7 over
  // the steps) sees a rounding change in the step's first split sum grow over 20 steps; measured
  // there 7e-5 with the vocabulary whole and 2.4e-4 split by it (the same step-1 gradients to the
  // bit; 30-36 elements of 65,536 above 1e-5 either way). The norms below catch a wrong block.
  for (const auto& [name, want] : ref.params) {
    errs.push_back(close(got.params.at(name), want, 0, 3e-4, "param " + name));
    errs.push_back(close_norm(got.params.at(name), want, 1e-4, "param " + name));
    errs.push_back(close_norm(got.m.at(name), ref.m.at(name), 1e-3, "adam.m " + name));
    errs.push_back(close_norm(got.v.at(name), ref.v.at(name), 1e-3, "adam.v " + name));
  }
  std::erase(errs, std::string());
  return errs;
}

inline std::vector<std::string> compare_grads(
    const std::map<std::string, std::vector<float>>& got,
    const std::map<std::string, std::vector<float>>& ref) {
  std::vector<std::string> errs;
  for (const auto& [name, want] : ref)
    errs.push_back(close(got.at(name), want, 1e-4, 1e-7, "grad " + name));
  std::erase(errs, std::string());
  return errs;
}

inline Config single(Config c) {
  c.plan = {};
  return c;
}

// Pipeline parallelism (training only: a pipeline runs no gradients-only step), on the mid Llama
// (3 blocks: 5 parameter groups to cut into 2 or 4 stages; 6 blocks for 4 stages of 2 chunks),
// each schedule, alone and beside data, fsdp and megatron, and pipeline x fsdp x megatron on
// 2 x 2 x 2; train.batch_size = 4 cut into 2 or 4 micro-batches.
inline std::vector<Case> pipeline_cases() {
  auto pipe = [](const char* schedule, int m) {
    return fmt::format(R"({{kind="pipeline",axis="pipe",schedule="{}",microbatches={}}})", schedule,
                       m);
  };
  const char* data = R"({kind="data",axis="data"})";
  const char* fsdp = R"({kind="fsdp",axis="data"})";
  const char* megatron = R"({kind="megatron",axis="model"})";
  auto list = [](const std::vector<std::string>& t) {
    return fmt::format("[{}]", fmt::join(t, ","));
  };
  return {
      {"pipeline2_gpipe", "{pipe=2}", list({pipe("gpipe", 4)}), "mid"},
      {"pipeline2_1f1b", "{pipe=2}", list({pipe("1f1b", 4)}), "mid"},
      {"pipeline4_gpipe", "{pipe=4}", list({pipe("gpipe", 2)}), "mid"},
      {"pipeline4_1f1b", "{pipe=4}", list({pipe("1f1b", 4)}), "mid"},
      {"pipeline_data_2x2", "{pipe=2,data=2}", list({pipe("1f1b", 2), data}), "mid"},
      {"pipeline_fsdp_2x2", "{pipe=2,data=2}", list({pipe("1f1b", 2), fsdp, data}), "mid"},
      {"pipeline_megatron_2x2", "{pipe=2,model=2}", list({pipe("1f1b", 4), megatron}), "mid"},
      {"pipeline_megatron_sequence_2x2", "{pipe=2,model=2}",
       list({pipe("gpipe", 2), megatron, R"({kind="sequence",axis="model"})"}), "mid"},
      {"pipeline2_interleaved", "{pipe=2}", list({pipe("interleaved", 4)}), "mid"},
      {"pipeline4_interleaved",
       "{pipe=4}",
       list({pipe("interleaved", 4)}),
       "mid",
       {"model.n_layers=6"}},
      {"pipeline_interleaved_data_2x2", "{pipe=2,data=2}", list({pipe("interleaved", 2), data}),
       "mid"},
      {"pipeline_fsdp_megatron_2x2x2", "{pipe=2,data=2,model=2}",
       list({pipe("1f1b", 2), megatron, fsdp, data}), "mid"},
      // bucket = "auto" merges a stage's gradients across its chunks: its list scheduling keeps
      // the sends and recvs in order (a recv moved before a send deadlocked the stages)
      {"pipeline_interleaved_data_auto_2x2",
       "{pipe=2,data=2}",
       list({pipe("interleaved", 2), data}),
       "mid",
       {"passes.bucket=\"auto\"",
        std::string("passes.cluster=\"") + LOOM_SOURCE_DIR + "/clusters/h100-sxm.toml\""}},
  };
}

// The tactics of the issue, on the tiny Llama, a mid-size one (3 layers, d_model 128, 8 heads), and
// the tiny GPT-2 (LayerNorm with bias, fused qkv, GELU MLP). With the default [passes] (bucket =
// "block", prefetch with 2 collectives in flight), and, for fsdp and data, without bucketing, with
// buckets so small that every group splits into several, without prefetch (every collective
// synchronous, on the compute thread), with one collective in flight at a time, and with each
// parameter gathered once per step (reshard_after_forward = false); and with recompute =
// "selective" and "full"; and with bucket = "auto" on a fast and a slow cluster.
inline std::vector<Case> cases() {
  const char* data = R"({kind="data",axis="data"})";
  const std::string fsdp_megatron =
      std::string(R"([{kind="megatron",axis="model"},{kind="fsdp",axis="data"},)") + data + "]";
  const std::string megatron_sequence =
      R"([{kind="megatron",axis="model"},{kind="sequence",axis="model"}])";
  // bucket = "auto" decides on a cluster: a fast one, and a slow-link one (tests/slow-link.toml)
  const std::string h100 =
      std::string("passes.cluster=\"") + LOOM_SOURCE_DIR + "/clusters/h100-sxm.toml\"";
  const std::string slow =
      std::string("passes.cluster=\"") + LOOM_SOURCE_DIR + "/tests/slow-link.toml\"";
  // P2's synthesized reductions (passes/synthesize.cc) on two hosts of two ranks each
  const std::string two_hosts =
      std::string("passes.cluster=\"") + LOOM_SOURCE_DIR + "/clusters/two-hosts.toml\"";
  return {
      {"data", "{data=2}", std::string("[") + data + "]"},
      {"data4", "{data=4}", std::string("[") + data + "]"},
      {"fsdp", "{data=2}", std::string(R"([{kind="fsdp",axis="data"},)") + data + "]"},
      {"zero1", "{data=2}", std::string(R"([{kind="zero1",axis="data"},)") + data + "]"},
      {"zero2", "{data=2}", std::string(R"([{kind="zero2",axis="data"},)") + data + "]"},
      {"megatron", "{model=2}", R"([{kind="megatron",axis="model"}])"},
      {"megatron_sequence", "{model=2}", megatron_sequence},
      {"fsdp_megatron_2x2", "{data=2,model=2}", fsdp_megatron},
      {"shard_lm_head", "{model=2}",
       R"([{kind="shard",axis="model",pattern="lm_head.weight",dim=0}])"},
      {"mid_fsdp_megatron_2x2", "{data=2,model=2}", fsdp_megatron, "mid"},
      {"mid_megatron_sequence", "{model=2}", megatron_sequence, "mid"},
      // the vocabulary's table gradient made in its model blocks from the stream's gradient
      // gathered in time, then reduce-scattered over data (propagate.cc's leading results)
      {"mid_fsdp_megatron_sequence_2x2", "{data=2,model=2}",
       std::string(R"([{kind="megatron",axis="model"},{kind="sequence",axis="model"},)"
                   R"({kind="fsdp",axis="data"},)") +
           data + "]",
       "mid"},
      {"gpt2_megatron", "{model=2}", R"([{kind="megatron",axis="model"}])", "gpt2"},
      {"gpt2_fsdp", "{data=2}", std::string(R"([{kind="fsdp",axis="data"},)") + data + "]", "gpt2"},
      // Mixture-of-Experts: capacity is per sequence and sequences stay whole on a rank, so the
      // same tokens drop as in one process
      {"moe_data", "{data=2}", std::string("[") + data + "]", "moe"},
      {"moe_expert", "{expert=2}", R"([{kind="expert",axis="expert"}])", "moe"},
      {"moe_expert4", "{expert=4}", R"([{kind="expert",axis="expert"}])", "moe"},
      {"moe_expert_fsdp_2x2", "{expert=2,data=2}",
       std::string(R"([{kind="expert",axis="expert"},{kind="fsdp",axis="data"},)") + data + "]",
       "moe"},
      {"moe_gpt2_expert", "{expert=2}", R"([{kind="expert",axis="expert"}])", "moe_gpt2"},
      {"moe_data_expert_2x2", "{data=2,expert=2}",
       std::string("[") + data + R"(,{kind="expert",axis="expert"}])", "moe"},
      // NormFormer: the head scales fold into the row-parallel output projection
      {"normformer_megatron", "{model=2}", R"([{kind="megatron",axis="model"}])", "normformer"},
      {"normformer_gpt2_expert_megatron_2x2", "{expert=2,model=2}",
       R"([{kind="expert",axis="expert"},{kind="megatron",axis="model"}])", "normformer_gpt2"},
      {"fsdp_unbucketed",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "tiny",
       {"passes.bucket=none"}},
      {"data_unbucketed",
       "{data=2}",
       std::string("[") + data + "]",
       "tiny",
       {"passes.bucket=none"}},
      {"mid_fsdp_small_buckets",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "mid",
       {"passes.bucket_mb=0.1"}},
      {"fsdp_synchronous",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "tiny",
       {"passes.prefetch=false"}},
      {"mid_fsdp_one_in_flight",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "mid",
       {"passes.max_in_flight=1", "passes.bucket_mb=0.1"}},
      {"data4_synthesized",
       "{data=4}",
       std::string("[") + data + "]",
       "tiny",
       {"passes.synthesize=true", two_hosts}},
      {"fsdp_megatron_2x2_synthesized",
       "{data=2,model=2}",
       fsdp_megatron,
       "tiny",
       {"passes.synthesize=true", "passes.bucket=none", two_hosts}},
      {"fsdp_gathered_once",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "tiny",
       {"passes.reshard_after_forward=false"}},
      {"mid_fsdp_megatron_gathered_once",
       "{data=2,model=2}",
       fsdp_megatron,
       "mid",
       {"passes.reshard_after_forward=false", "passes.max_in_flight=3"}},
      {"gpt2_fsdp_recompute",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "gpt2",
       {"passes.recompute=selective"}},
      {"mid_megatron_sequence_recompute",
       "{model=2}",
       megatron_sequence,
       "mid",
       {"passes.recompute=selective"}},
      {"mid_fsdp_megatron_recompute_full",
       "{data=2,model=2}",
       fsdp_megatron,
       "mid",
       {"passes.recompute=full"}},
      {"gpt2_megatron_sequence_recompute_full",
       "{model=2}",
       megatron_sequence,
       "gpt2",
       {"passes.recompute=full", "passes.reshard_after_forward=false"}},
      {"fsdp_bucket_auto",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "tiny",
       {"passes.bucket=auto", h100}},
      {"mid_fsdp_megatron_bucket_auto",
       "{data=2,model=2}",
       fsdp_megatron,
       "mid",
       {"passes.bucket=auto", slow}},
      // gradient accumulation under a plan (passes/micro_batch.cc): the one-process reference
      // accumulates too
      {"data_accum", "{data=2}", std::string("[") + data + "]", "tiny", {"train.grad_accum=2"}},
      {"fsdp_accum",
       "{data=2}",
       std::string(R"([{kind="fsdp",axis="data"},)") + data + "]",
       "tiny",
       {"train.grad_accum=3"}},
      {"zero2_accum",
       "{data=2}",
       std::string(R"([{kind="zero2",axis="data"},)") + data + "]",
       "tiny",
       {"train.grad_accum=2"}},
      {"mid_fsdp_megatron_accum", "{data=2,model=2}", fsdp_megatron, "mid", {"train.grad_accum=2"}},
      {"gpt2_megatron_sequence_accum",
       "{model=2}",
       megatron_sequence,
       "gpt2",
       {"train.grad_accum=2"}},
      {"moe_expert_fsdp_accum",
       "{expert=2,data=2}",
       R"([{kind="expert",axis="expert"},{kind="fsdp",axis="data"},{kind="data",axis="data"}])",
       "moe",
       {"train.grad_accum=2", "passes.max_in_flight=1"}},
      {"mid_data_unbucketed_prefetch",
       "{data=2}",
       std::string("[") + data + "]",
       "mid",
       {"passes.bucket=none", "passes.max_in_flight=4"}},
  };
}

// The case of cases() named `name` (an empty Case when there is none).
inline Case case_named(const std::string& name) {
  for (const Case& x : cases())
    if (x.name == name) return x;
  return Case{};
}

}  // namespace loom::train::parity
