#include "loom/train/step.h"

#include <cmath>
#include <cstring>

#include "loom/autodiff/autodiff.h"
#include "loom/core/error.h"
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
    exec_->bind(hyper_, hyper_buf_);
    moments_.reserve(g.inputs_of_kind(ir::ValueKind::state).size());
    for (const ir::Value& v : g.values())
      if (v.kind == ir::ValueKind::state) {
        moments_.emplace_back(size_t(numel(v.type.shape)), 0.0f);
        exec_->bind(v.id, moments_.back().data());
      }
    for (auto [p, m] : ts.moments_m) moment_of_["m:" + g.value(p).name] = exec_->ptr<float>(m);
    for (auto [p, v] : ts.moments_v) moment_of_["v:" + g.value(p).name] = exec_->ptr<float>(v);
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
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(&inputs_[size_t(b * T)], tokens + b * (T + 1), size_t(T) * 4);
    std::memcpy(&targets_[size_t(b * T)], tokens + b * (T + 1) + 1, size_t(T) * 4);
  }
  if (mode_ == Mode::train) {
    ++t_;
    hyper_buf_[0] = float(lr);
    hyper_buf_[1] = float(1.0 - std::pow(cfg_.optim.beta1, double(t_)));
    hyper_buf_[2] = float(1.0 - std::pow(cfg_.optim.beta2, double(t_)));
  }
  exec_->run();
  return *exec_->ptr<float>(model_.loss);
}

const float* StepRunner::logits() const { return exec_->ptr<float>(model_.logits); }

const float* StepRunner::grad(const std::string& param) const {
  auto it = grad_of_.find(param);
  LOOM_CHECK(it != grad_of_.end()) << "no gradient for " << param;
  return exec_->ptr<float>(it->second);
}

float StepRunner::grad_norm() const {
  LOOM_CHECK(grad_norm_ >= 0);
  return *exec_->ptr<float>(grad_norm_);
}

int64_t StepRunner::planned_peak_bytes() const {
  return exec_->plan().arena_bytes + exec_->plan().external_bytes;
}

}  // namespace loom::train
