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
//
// With a [plan] and communicators (one StepRunner per rank), the graph is sharded (shard/lower.h) and
// the executor runs this rank's program. Every rank passes the same whole batch; the runner keeps its
// own block. Parameters split by the plan live in the runner (its block only) and reach the
// ParamStore by push_params() (collective); replicated ones are updated in the ParamStore itself, so
// ranks that are threads of one process need a ParamStore each. Calls marked collective must be made
// by every rank in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/models/model.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/executor.h"
#include "loom/shard/lower.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::train {

// Shards the training step of cfg's [plan] as every rank's StepRunner will, so a plan's errors
// (loom::Error naming the tactic, value and axis) come before any rank starts.
void check_plan(const Config& cfg);

class StepRunner {
 public:
  enum class Mode { grads, train, eval, infer };
  // comms: this rank's mesh communicators when cfg has a [plan] (null: one process, no plan). Throws
  // loom::Error for a plan that does not fit the model or the ranks.
  // share: a sharded runner of the same plan whose parameter blocks this one reads and writes too
  // (an evaluator beside its trainer: no second copy, nothing to refresh).
  StepRunner(const Config& cfg, ParamStore& params, Mode mode,
             const runtime::MeshComms* comms = nullptr, StepRunner* share = nullptr);
  ~StepRunner();

  // Runs one step on tokens (B, T+1); returns the loss. Throws loom::Error for token ids outside the
  // vocabulary.
  float step(const int32_t* tokens);
  // Mode::train: one update at learning rate `lr` (a schedule's value for this step).
  float step(const int32_t* tokens, double lr);

  const ir::Graph& graph() const { return model_.graph; }       // the global graph
  const ir::Graph& program() const { return exec_->graph(); }  // what this rank runs
  bool sharded() const { return sharded_ != nullptr; }
  int64_t rows_per_step() const { return cfg_.train.batch_size * accum_; }
  runtime::Executor& executor() { return *exec_; }
  const float* logits() const;
  const float* grad(const std::string& param) const;  // Mode::grads, unsharded only
  // Mode::grads: the whole gradient of a parameter (collective when sharded).
  std::vector<float> full_grad(const std::string& param);
  float grad_norm() const;                            // Mode::train only
  int64_t step_count() const { return t_; }
  // Optimizer state, for checkpoints (Mode::train): AdamW's first (which = 0) or second (1) moment of
  // a parameter, and the number of updates taken (AdamW's bias correction uses it).
  // read_moment fills `full` (the parameter's whole shape) and is collective when sharded;
  // write_moment takes this rank's block of `full`.
  void read_moment(const std::string& param, int which, float* full);
  void write_moment(const std::string& param, int which, const float* full);
  // Sharded runs: gather the parameters this rank holds a block of into the ParamStore (collective),
  // or take this rank's blocks from it (after loading weights into the store).
  void push_params();
  void pull_params();
  // Frees the ParamStore's whole copies of the parameters this rank holds blocks of (push_params
  // brings them back). No-op unsharded.
  void release_params();
  void set_step_count(int64_t t) { t_ = t; }
  // Bytes of the activation arena plus every bound buffer (params, gradients live in the arena,
  // optimizer moments, inputs).
  int64_t planned_peak_bytes() const;
  // Bytes this rank keeps for parameters, their gradients and the optimizer moments (as planned).
  struct StateBytes {
    int64_t params = 0, grads = 0, moments = 0;
  };
  StateBytes state_bytes() const;

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
  std::map<std::string, float*> moment_of_;  // "m:" / "v:" + param name -> buffer (this rank's block)
  int64_t accum_ = 1;
  // Gradient accumulation (accum_ > 1): the optimizer as its own graph, fed the summed gradients.
  ir::Graph opt_graph_{"optimizer"};
  std::unique_ptr<runtime::Executor> opt_exec_;
  std::vector<std::pair<int, std::vector<float>>> accum_grads_;  // model-graph grad id, sum
  float hyper_buf_[3] = {0, 0, 0};
  int64_t t_ = 0;
  // sharded runs
  struct RankState {
    const runtime::MeshComms* comms = nullptr;
    shard::Sharded plan;
    std::map<std::string, std::vector<float>> params;  // split parameters: this rank's own blocks
    std::map<std::string, float*> param_ptr;  // every split parameter's block (own or a shared runner's)
    std::vector<int32_t> tokens, targets;     // this rank's block of the batch
    int64_t rank() const { return comms->world().rank(); }
  };
  std::unique_ptr<RankState> sharded_;
  int out_loss_ = -1;  // the executor's loss value
  std::map<int, int> out_local_;         // global output value -> the executor's value
  std::map<std::string, int> state_of_;  // sharded: "m:" / "v:" + param name -> global state value
  float* moment_ptr(const std::string& param, int which);
  // Builds and binds this rank's program; returns each AdamW moment's buffer (by global value).
  std::map<int, float*> shard_program(const runtime::MeshComms* comms, StepRunner* share);
  // The whole value of global value v from this rank's blocks (collective).
  std::vector<float> gather(int v, const float* local);
};

}  // namespace loom::train
