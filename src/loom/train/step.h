// StepRunner: compiles a model into one executable program and runs it on batches.
//
// Mode::grads   forward + backward: loss, logits and every parameter's gradient (loom step, tests).
// Mode::train   forward + backward + clipping + AdamW, updating the ParamStore in place (bench, train).
// Mode::eval    forward and loss only (validation).
// Mode::infer   forward, loss and logits (sampling): the logits survive, so they cost a buffer.
// A batch is tokens (rows_per_step(), T+1): inputs are [:, :-1], targets [:, 1:]. In Mode::train with
// [train] grad_accum = k > 1, a step runs the forward+backward graph on k micro-batches of B rows,
// sums their gradients (scaled by 1/k: the gradient of the mean loss over all k*B rows) and then runs
// a separate optimizer graph; the returned loss is the mean over the micro-batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/models/model.h"
#include "loom/runtime/executor.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::train {

class StepRunner {
 public:
  enum class Mode { grads, train, eval, infer };
  StepRunner(const Config& cfg, ParamStore& params, Mode mode);
  ~StepRunner();

  // Runs one step on tokens (B, T+1); returns the loss. Throws loom::Error for token ids outside the
  // vocabulary.
  float step(const int32_t* tokens);
  // Mode::train: one update at learning rate `lr` (a schedule's value for this step).
  float step(const int32_t* tokens, double lr);

  const ir::Graph& graph() const { return model_.graph; }
  int64_t rows_per_step() const { return cfg_.train.batch_size * accum_; }
  runtime::Executor& executor() { return *exec_; }
  const float* logits() const;
  const float* grad(const std::string& param) const;  // Mode::grads only
  float grad_norm() const;                            // Mode::train only
  int64_t step_count() const { return t_; }
  // Optimizer state, for checkpoints (Mode::train): AdamW's first (which = 0) or second (1) moment of
  // a parameter, and the number of updates taken (AdamW's bias correction uses it).
  float* moment(const std::string& param, int which);
  void set_step_count(int64_t t) { t_ = t; }
  // Bytes of the activation arena plus every bound buffer (params, gradients live in the arena,
  // optimizer moments, inputs).
  int64_t planned_peak_bytes() const;

 private:
  Config cfg_;
  ParamStore& params_;
  Mode mode_;
  models::ModelGraph model_;
  std::unique_ptr<runtime::Executor> exec_;
  std::map<std::string, int> grad_of_;
  int grad_norm_ = -1, hyper_ = -1;
  std::vector<int32_t> inputs_, targets_;
  std::vector<std::vector<float>> moments_;
  std::map<std::string, float*> moment_of_;  // "m:" / "v:" + param name -> buffer
  int64_t accum_ = 1;
  // Gradient accumulation (accum_ > 1): the optimizer as its own graph, fed the summed gradients.
  ir::Graph opt_graph_{"optimizer"};
  std::unique_ptr<runtime::Executor> opt_exec_;
  std::vector<std::pair<int, std::vector<float>>> accum_grads_;  // model-graph grad id, sum
  float hyper_buf_[3] = {0, 0, 0};
  int64_t t_ = 0;
};

}  // namespace loom::train
