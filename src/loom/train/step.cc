#include "loom/train/step.h"

#include <cmath>
#include <cstring>

#include "loom/autodiff/autodiff.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/ops/verify.h"

namespace loom::train {

StepRunner::StepRunner(const Config& cfg, ParamStore& params, Mode mode)
    : cfg_(cfg), params_(params), mode_(mode) {
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  model_ = models::build_model(cfg.model, B, T);
  autodiff::TrainStep ts;
  ir::Graph& g = model_.graph;
  if (mode == Mode::grads) {
    ops::Builder b(g);
    auto grads = autodiff::gradients(b, model_.loss, g.inputs_of_kind(ir::ValueKind::param));
    g.add_output(model_.loss);
    g.add_output(model_.logits);
    for (auto [p, d] : grads) {
      g.add_output(d);
      grad_of_[g.value(p).name] = d;
    }
  } else if (mode == Mode::eval) {
    g.add_output(model_.loss);
  } else if (mode == Mode::infer) {
    g.add_output(model_.loss);
    g.add_output(model_.logits);
  } else if (cfg.train.grad_accum > 1) {
    accum_ = cfg.train.grad_accum;
    ops::Builder b(g);
    auto grads = autodiff::gradients(b, model_.loss, g.inputs_of_kind(ir::ValueKind::param));
    g.add_output(model_.loss);
    std::map<int, int> opt_grads;  // optimizer-graph param -> its gradient input
    for (auto [p, d] : grads) {
      g.add_output(d);
      const ir::Value& pv = g.value(p);
      int op = opt_graph_.add_input(pv.name, pv.type, ir::ValueKind::param);
      opt_grads[op] = opt_graph_.add_input("grad." + pv.name, pv.type, ir::ValueKind::input);
      accum_grads_.push_back({d, std::vector<float>(size_t(numel(pv.type.shape)))});
    }
    ts = autodiff::add_optimizer(opt_graph_, opt_grads, cfg.optim);
    opt_graph_.add_output(ts.grad_norm);
    grad_norm_ = ts.grad_norm;
    hyper_ = ts.hyper;
    ops::verify_or_throw(opt_graph_, "optimizer graph for " + cfg.path);
    opt_exec_ = std::make_unique<runtime::Executor>(opt_graph_);
    size_t i = 0;
    for (auto [p, d] : grads) {
      opt_exec_->bind(opt_graph_.find(g.value(p).name), params_.data(g.value(p).name));
      opt_exec_->bind(opt_grads.at(opt_graph_.find(g.value(p).name)), accum_grads_[i++].second.data());
    }
  } else {
    ts = autodiff::build_train_step(g, model_.loss, cfg.optim);
    grad_norm_ = ts.grad_norm;
    hyper_ = ts.hyper;
  }
  ops::verify_or_throw(g, "training graph for " + cfg.path);
  exec_ = std::make_unique<runtime::Executor>(g);
  for (const auto& p : params_.infos()) exec_->bind(g.find(p.name), params_.data(p.name));
  inputs_.resize(size_t(B * T));
  targets_.resize(size_t(B * T));
  exec_->bind(model_.tokens, inputs_.data());
  exec_->bind(model_.targets, targets_.data());
  if (mode == Mode::train) {
    // the optimizer's inputs live in the fused graph, or in the optimizer graph when accumulating
    runtime::Executor& ox = opt_exec_ ? *opt_exec_ : *exec_;
    const ir::Graph& og = ox.graph();
    ox.bind(hyper_, hyper_buf_);
    moments_.reserve(og.inputs_of_kind(ir::ValueKind::state).size());
    for (const ir::Value& v : og.values())
      if (v.kind == ir::ValueKind::state) {
        moments_.emplace_back(size_t(numel(v.type.shape)), 0.0f);
        ox.bind(v.id, moments_.back().data());
      }
    for (auto [p, m] : ts.moments_m) moment_of_["m:" + og.value(p).name] = ox.ptr<float>(m);
    for (auto [p, v] : ts.moments_v) moment_of_["v:" + og.value(p).name] = ox.ptr<float>(v);
  }
}

StepRunner::~StepRunner() = default;

float StepRunner::step(const int32_t* tokens) { return step(tokens, cfg_.optim.lr); }

float* StepRunner::moment(const std::string& param, int which) {
  auto it = moment_of_.find((which == 0 ? "m:" : "v:") + param);
  LOOM_CHECK(it != moment_of_.end()) << "no optimizer moment for " << param;
  return it->second;
}

float StepRunner::step(const int32_t* tokens, double lr) {
  const int64_t B = cfg_.train.batch_size, T = cfg_.train.seq_len;
  auto load_rows = [&](const int32_t* rows) {
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(&inputs_[size_t(b * T)], rows + b * (T + 1), size_t(T) * 4);
      std::memcpy(&targets_[size_t(b * T)], rows + b * (T + 1) + 1, size_t(T) * 4);
    }
  };
  if (mode_ == Mode::train) {
    ++t_;
    hyper_buf_[0] = float(lr);
    hyper_buf_[1] = float(1.0 - std::pow(cfg_.optim.beta1, double(t_)));
    hyper_buf_[2] = float(1.0 - std::pow(cfg_.optim.beta2, double(t_)));
  }
  if (!opt_exec_) {
    load_rows(tokens);
    exec_->run();
    return *exec_->ptr<float>(model_.loss);
  }
  // Gradient accumulation: sum micro-batch gradients, then one optimizer step on their mean.
  double loss = 0;
  for (int64_t i = 0; i < accum_; ++i) {
    load_rows(tokens + i * B * (T + 1));
    exec_->run();
    loss += *exec_->ptr<float>(model_.loss);
    for (auto& [d, sum] : accum_grads_) {
      const float* g = exec_->ptr<float>(d);
      const int64_t n = int64_t(sum.size());
      if (i == 0) std::memcpy(sum.data(), g, size_t(n) * 4);
      else kernels::cpu::add(sum.data(), g, sum.data(), n);
    }
  }
  for (auto& [d, sum] : accum_grads_)
    kernels::cpu::scale(sum.data(), float(1.0 / double(accum_)), sum.data(), int64_t(sum.size()));
  opt_exec_->run();
  return float(loss / double(accum_));
}

const float* StepRunner::logits() const { return exec_->ptr<float>(model_.logits); }

const float* StepRunner::grad(const std::string& param) const {
  auto it = grad_of_.find(param);
  LOOM_CHECK(it != grad_of_.end()) << "no gradient for " << param;
  return exec_->ptr<float>(it->second);
}

float StepRunner::grad_norm() const {
  LOOM_CHECK(grad_norm_ >= 0);
  return *(opt_exec_ ? opt_exec_ : exec_)->ptr<float>(grad_norm_);
}

int64_t StepRunner::planned_peak_bytes() const {
  int64_t b = exec_->plan().arena_bytes + exec_->plan().external_bytes;
  if (opt_exec_)  // the optimizer graph: its arena, gradient sums and moments; params counted once
    b += opt_exec_->plan().arena_bytes + opt_exec_->plan().external_bytes -
         params_.total_elements() * 4;
  return b;
}

}  // namespace loom::train
