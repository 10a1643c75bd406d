// StepRunner: runs a compiled training step (compile.h) on batches, on one process or as one rank
// of a plan (rank_blocks.h holds what the rank keeps of split tensors).
//
// Mode::grads   forward + backward: loss, logits and every parameter's gradient (loom step, tests).
// Mode::train   forward + backward + clipping + AdamW, updating the ParamStore in place (bench,
// train). Mode::eval    forward and loss only (validation). Mode::infer   forward, loss and logits
// (sampling): the logits survive, so they cost a buffer. A batch is tokens (rows_per_step(), T+1):
// inputs are [:, :-1], targets [:, 1:]. In Mode::train with [train] grad_accum = k > 1, a step runs
// k micro-batches of B rows, summing their gradients, and one update with their mean (the gradient
// of the mean loss over all k*B rows): the program's micro-batch prefix on the first k - 1, all of
// it on the last (passes::Accumulation), with or without a plan; the returned loss is the mean over
// the micro-batches.
//
// With a [plan] and communicators (one StepRunner per rank), the executor runs this rank's program.
// Every rank passes the same whole batch; the runner keeps its own block. Parameters split by the
// plan live in the runner's RankBlocks and reach the ParamStore by push_params() (collective);
// replicated ones are updated in the ParamStore itself, so ranks that are threads of one process
// need a ParamStore each. Calls marked collective must be made by every rank in the same order.
//
// The step runs on [train] device (backend/backend.h). On the CPU the executor reads the
// ParamStore and the runner's buffers where they are. On a GPU every bound buffer (parameters,
// moments, gradient sums, the batch, the hyper-parameters) lives in the device's memory: the batch
// and the hyper-parameters go up before each run, the loss and metrics come down after it, and the
// parameters meet the ParamStore only at push_params() (to the store: checkpoints, exports) and
// pull_params() (from it: loaded weights), as a sharded rank's blocks do. A GPU run is one process
// without a [plan] (multi-GPU waits for NCCL behind the collective nodes).
//
// Not here: building the graph (compile.h, passes/), the training loop (loop.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/runtime/collectives.h"
#include "loom/runtime/executor.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"
#include "loom/train/params.h"
#include "loom/train/rank_blocks.h"
#include "loom/train/sharded_checkpoint.h"

namespace loom::train {

class StepRunner {
 public:
  using Mode = passes::StepKind;
  // comms: this rank's mesh communicators when cfg has a [plan] (null: one process, no plan).
  // Throws loom::Error for a plan that does not fit the model or the ranks. share: a sharded runner
  // of the same plan whose parameter blocks this one reads and writes too (an evaluator beside its
  // trainer: no second copy, nothing to refresh).
  StepRunner(const Config& cfg, ParamStore& params, Mode mode,
             const runtime::MeshComms* comms = nullptr, StepRunner* share = nullptr);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Runs one step on tokens (B, T+1); returns the loss. Throws loom::Error for token ids outside
  // the vocabulary.
  float step(const int32_t* tokens);
  // Mode::train: one update at learning rate `lr` (a schedule's value for this step).
  float step(const int32_t* tokens, double lr);

  const ir::Graph& graph() const { return step_.graph(); }     // the global graph
  const ir::Graph& program() const { return exec_->graph(); }  // what this rank runs
  bool sharded() const { return blocks_ != nullptr; }
  int64_t rows_per_step() const { return cfg_.train.batch_size * step_.accum; }
  runtime::Executor& executor() { return *exec_; }
  // Records the following steps into `trace` (null stops); see runtime/trace.h.
  void set_trace(runtime::Trace* trace);
  // Communication the step's executors saw, summed over steps (runtime::Executor::comm_stats).
  runtime::Executor::CommStats comm_stats() const;
  const float* logits() const;  // the last step's (B, T, V); not kept by Mode::eval
  // The last step's cross-entropy alone (the loss less an MoE model's auxiliary losses; = the
  // loss for a dense model), averaged over micro-batches like the loss.
  float ce_loss() const { return ce_loss_; }
  // MoE models: the last step's tokens per expert, summed over micro-batches, each MoE layer's E
  // in turn (models/model.h: ModelGraph::moe_kept, moe_routed); empty for a dense model.
  struct RouterLoad {
    std::vector<float> kept, routed;
  };
  const RouterLoad& router_load() const { return load_; }
  const float* grad(const std::string& param) const;  // Mode::grads, unsharded only
  // Mode::grads: the whole gradient of a parameter (collective when sharded).
  std::vector<float> full_grad(const std::string& param);
  float grad_norm() const;  // Mode::train only
  int64_t step_count() const { return t_; }
  // Optimizer state, for checkpoints (Mode::train): AdamW's first or second moment of a parameter,
  // and the number of updates taken (AdamW's bias correction uses it).
  // read_moment fills `full` (the parameter's whole shape) and is collective when sharded;
  // write_moment takes this rank's block of `full`.
  void read_moment(const std::string& param, autodiff::Moment which, float* full);
  void write_moment(const std::string& param, autodiff::Moment which, const float* full);
  // Sharded runs: gather the parameters this rank holds a block of into the ParamStore
  // (collective), or take this rank's blocks from it (after loading weights into the store).
  // On a GPU: copy the parameters down to the store, or up from it.
  void push_params();
  void pull_params();
  runtime::Device& device() const { return dev_; }
  // Frees the ParamStore's whole copies of the parameters this rank holds blocks of (push_params
  // brings them back). No-op unsharded.
  void release_params();
  // Under a pipeline tactic only a parameter's own stage updates it and its moments; this sends
  // every parameter's and moment's block from that stage to the others (collective), so that
  // every rank holds them current (a checkpoint's writer, push_params). No-op without one.
  void refresh_stage_replicas();
  void set_step_count(int64_t t) { t_ = t; }
  // Sharded runs (Mode::train): every parameter and AdamW moment as this rank holds it, named as
  // checkpoints name them (sharded_checkpoint.h), and the plan's mesh and world communicator.
  std::vector<HeldTensor> held_tensors() const;
  const shard::Mesh& mesh() const { return cfg_.plan.plan.mesh; }
  comm::Communicator& world() const;
  // Bytes of the activation arena plus every bound buffer (params, gradients live in the arena,
  // optimizer moments, inputs).
  int64_t planned_peak_bytes() const;
  // Bytes this rank keeps for parameters, their gradients and the optimizer moments (as planned).
  struct StateBytes {
    int64_t params = 0, grads = 0, moments = 0;
  };
  StateBytes state_bytes() const;
  // Planned bytes of the activations the step keeps for its backward (runtime/memory_plan.h).
  int64_t activation_bytes() const;

 private:
  using MomentKey = std::pair<std::string, autodiff::Moment>;  // (param name, which)
  Config cfg_;
  ParamStore& params_;
  Mode mode_;
  runtime::Device& dev_;
  CompiledStep step_;
  std::unique_ptr<runtime::Executor> exec_;
  std::unique_ptr<RankBlocks> blocks_;     // sharded runs
  std::vector<int32_t> inputs_, targets_;  // the batch (B,T), whole
  // Sharded: this rank's block of each batch input, filled from the step's rows starting at row0
  // (a pipeline's micro-batch k: k * B/m; else 0).
  struct BatchBlock {
    int value;
    bool targets;
    int64_t row0;
    std::vector<int32_t> block;
  };
  std::vector<BatchBlock> batch_blocks_;
  BatchBlock* batch_block(int v);
  const runtime::MeshComms* comms_ = nullptr;  // sharded runs
  // The stage owning a parameter under a pipeline tactic (-1 without one), and the broadcast from
  // it over the pipeline's axis of `n` floats at p (collective over that axis).
  int64_t owner_stage(const std::string& param) const;
  void from_owner(const std::string& param, float* p, int64_t n) const;
  // Memory bound to the executors besides the ParamStore: moments, gradient sums; on a device
  // without host memory also the device copies of the parameters, the batch and hyper_buf_.
  std::vector<runtime::Buffer> buffers_;
  std::map<std::string, float*> param_copy_;  // on a GPU: each parameter's device copy
  // Host buffers read by a run, and where the device reads them (on the CPU the same memory): sent
  // up before each run.
  struct Staged {
    const void* host;
    void* dev;
    int64_t bytes;
  };
  std::vector<Staged> staged_;
  mutable std::map<const void*, std::vector<float>> host_copy_;  // a GPU's outputs, brought down
  std::map<MomentKey, float*> moment_of_;                        // this rank's block of each moment
  std::map<MomentKey, int> moment_value_;  // sharded: each moment's global state value
  std::map<int, int> out_local_;           // sharded: global output value -> the executor's value
  float hyper_buf_[3] = {0, 0, 0};
  float accum_buf_[2] = {1, 1};  // gradient accumulation's %accum.keep, %accum.scale
  float ce_loss_ = 0;
  RouterLoad load_;
  // After the step graph ran on micro-batch i: adds its cross-entropy and router load to the
  // step's (i == 0 starts them).
  void collect_forward_outputs(int64_t i);
  int64_t t_ = 0;
  // Binds this rank's program: parameters (own or `share`'s blocks, or the store's whole copies),
  // the batch blocks, the hyper-parameters and the moments.
  void bind_rank_program(const runtime::MeshComms& comms, StepRunner* share);
  void bind_program(StepRunner* share);
  // A global value in exec_'s program: a sharded run's outputs; a one-process run's every value
  // (its one-rank program: CompiledStep::c.rank).
  int out(int v) const { return blocks_ ? out_local_.at(v) : step_.c.rank.local[size_t(v)]; }
  int grad_of(const std::string& param) const;
  // n floats of the device's memory bound by this runner, zeroed (or `init`'s copy).
  float* device_floats(int64_t n, const float* init = nullptr);
  // What the executor reads for a host buffer: itself on the CPU, a device copy sent up before
  // every run (staged_) on a GPU.
  void* staged(const void* host, int64_t bytes);
  void send_staged();
  // An executor value's floats on the host (brought down on a GPU), valid until the next call for
  // that value.
  const float* host_floats(const runtime::Executor& ex, int v, int64_t n) const;
  float host_scalar(const runtime::Executor& ex, int v) const { return *host_floats(ex, v, 1); }
  // A GPU batch's token ids are checked here (the CPU kernels check their own).
  void check_token_ids() const;
  float* moment_ptr(const std::string& param, autodiff::Moment which);
};

}  // namespace loom::train
