#include "loom/train/step.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/backend/backend.h"
#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/train/memory.h"

namespace loom::train {

namespace {

// The device the step runs on: [train] device, opened (backend.h); a GPU runs one process.
runtime::Device& open_device(const Config& cfg, const runtime::MeshComms* comms) {
  if (cfg.train.device != runtime::DeviceKind::cpu && comms)
    throw Error(fmt::format("{}: device = \"{}\" with a [plan]: a GPU runs one process for now",
                            cfg.path, runtime::device_name(cfg.train.device)),
                "drop [plan], or set device = \"cpu\"");
  return backend::open(cfg.train.device);
}

// The step compiled, once the device's memory is known to hold it (train/memory.h).
CompiledStep compile_fitting(const Config& cfg, StepRunner::Mode mode,
                             const runtime::MeshComms* comms, const runtime::Device& dev) {
  const int64_t ranks = comms ? comms->world().size() : 0;
  const bool host = dev.host_memory();
  check_step_fits(cfg, mode == StepRunner::Mode::train, std::max<int64_t>(ranks, 1),
                  host ? machine_memory_bytes() : dev.memory_bytes(),
                  host ? "this machine's" : dev.describe() + "'s");
  return compile_step(cfg, mode, comms != nullptr, ranks, comms ? comms->world().rank() : 0);
}

}  // namespace

StepRunner::StepRunner(const Config& cfg, ParamStore& params, Mode mode,
                       const runtime::MeshComms* comms, StepRunner* share)
    : cfg_(cfg),
      params_(params),
      mode_(mode),
      dev_(open_device(cfg, comms)),
      step_(compile_fitting(cfg, mode, comms, dev_)) {
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  inputs_.resize(size_t(B * T));
  targets_.resize(size_t(B * T));
  if (step_.sharded)
    bind_rank_program(*comms, share);
  else
    bind_program(share);
}

float* StepRunner::device_floats(int64_t n, const float* init) {
  buffers_.emplace_back(dev_, std::max<int64_t>(n, 1) * 4);
  float* p = static_cast<float*>(buffers_.back().data());
  if (init)
    dev_.upload(p, init, n * 4);
  else
    dev_.zero(p, n * 4);
  return p;
}

void* StepRunner::staged(const void* host, int64_t bytes) {
  if (dev_.host_memory()) return const_cast<void*>(host);
  buffers_.emplace_back(dev_, bytes);
  staged_.push_back({host, buffers_.back().data(), bytes});
  return buffers_.back().data();
}

void StepRunner::send_staged() {
  if (staged_.empty()) return;
  check_token_ids();
  for (const Staged& st : staged_) dev_.upload(st.dev, st.host, st.bytes);
}

void StepRunner::check_token_ids() const {
  const int64_t V = cfg_.model.vocab_size;
  for (int v : {step_.c.model.tokens, step_.c.model.targets}) {
    if (v < 0) continue;
    const std::vector<int32_t>& ids = v == step_.c.model.tokens ? inputs_ : targets_;
    for (size_t j = 0; j < ids.size(); ++j)
      if (ids[j] < 0 || ids[j] >= V)
        throw Error(fmt::format("%{}: token id {} at position {} is outside the vocabulary [0, {})",
                                graph().value(v).name, ids[j], j, V));
  }
}

const float* StepRunner::host_floats(const runtime::Executor& ex, int v, int64_t n) const {
  const void* p = ex.data(v);
  if (dev_.host_memory()) return static_cast<const float*>(p);
  std::vector<float>& h = host_copy_[p];
  h.resize(size_t(n));
  dev_.download(h.data(), p, n * 4);
  return h.data();
}

void StepRunner::bind_program(StepRunner* share) {
  const ir::Graph& g = step_.graph();
  exec_ = std::make_unique<runtime::Executor>(step_.c.rank.graph, dev_);
  // the parameters: the store's own memory on the CPU; on a GPU a copy of it (or the copy of the
  // runner this one shares parameters with)
  auto param = [&](const std::string& name) -> float* {
    if (dev_.host_memory()) return params_.data(name);
    auto it = param_copy_.find(name);
    if (it != param_copy_.end()) return it->second;
    float* p = share ? share->param_copy_.at(name)
                     : device_floats(numel(params_.info(name).shape), params_.data(name));
    return param_copy_[name] = p;
  };
  for (const auto& p : params_.infos()) exec_->bind(out(g.find(p.name)), param(p.name));
  exec_->bind(out(step_.c.model.tokens), staged(inputs_.data(), int64_t(inputs_.size()) * 4));
  exec_->bind(out(step_.c.model.targets), staged(targets_.data(), int64_t(targets_.size()) * 4));
  if (mode_ != Mode::train) return;
  exec_->bind(out(step_.optimizer().hyper), staged(hyper_buf_, sizeof hyper_buf_));
  if (const passes::Accumulation* a = step_.accumulation()) {
    exec_->bind(out(a->keep), staged(&accum_buf_[0], 4));
    exec_->bind(out(a->scale), staged(&accum_buf_[1], 4));
  }
  // the moments and gradient sums, zeroed
  const ir::Graph& prog = exec_->graph();
  for (const ir::Value& v : prog.values())
    if (v.kind == ir::ValueKind::state) exec_->bind(v.id, device_floats(numel(v.type.shape)));
  for (auto [key, st] : step_.optimizer().moments)
    moment_of_[{g.value(key.first).name, key.second}] = exec_->ptr<float>(out(st));
}

namespace {

// The sequence of collectives a rank program issues (op, axis, bytes, start or not), hashed: every
// rank must issue the same, or the job deadlocks or mixes data. Ranks compile alone, so a
// difference between them (bucket = "auto" deciding on different [passes] cluster files, a config
// edited between hosts) is caught here, before anything runs.
uint64_t collectives_hash(const ir::Graph& g) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  };
  for (const ir::Node& n : g.nodes()) {
    if (!ops::has_trait(n.op, ops::Trait::collective)) continue;
    mix(fmt::format("{} {} {} {};", n.op, n.attr_str("axis"),
                    runtime::value_bytes(g.value(n.inputs[0])), n.attr_int("async", 0)));
  }
  return h;
}

}  // namespace

void StepRunner::bind_rank_program(const runtime::MeshComms& comms, StepRunner* share) {
  const ir::Graph& g = step_.graph();
  const shard::Program& prog = step_.c.rank;
  {
    const uint64_t mine = collectives_hash(prog.graph);
    std::vector<uint64_t> all(size_t(comms.world().size()));
    comms.world().all_gather(&mine, all.data(), 8);
    // a pipeline's stages run different programs: each rank is compared with the first rank of
    // its stage
    const shard::Tactic* pipe = shard::find_pipeline(cfg_.plan.plan);
    const shard::Mesh& mesh = cfg_.plan.plan.mesh;
    auto stage = [&](size_t r) { return pipe ? mesh.coord(int64_t(r), pipe->axis) : 0; };
    for (size_t r = 0; r < all.size(); ++r) {
      size_t first = 0;
      while (stage(first) != stage(r)) ++first;
      if (all[r] != all[first])
        throw Error(fmt::format(
            "{}: rank {} compiled other collectives than rank {} (the ranks' programs differ: "
            "give every host the same config{})",
            cfg_.path, r, first,
            cfg_.passes.bucket == passes::ScheduleOptions::Bucket::automatic
                ? ", and the same [passes] cluster file, which bucket = \"auto\" decides from"
                : ""));
    }
  }
  comms_ = &comms;
  comms.prepare(prog.graph);  // the sub-groups of synthesized reductions
  blocks_ = std::make_unique<RankBlocks>(step_.c, cfg_.plan.plan.mesh, comms);
  {
    const models::ModelGraph& m = step_.c.model;
    auto add = [&](int v, int64_t row0) {
      batch_blocks_.push_back(
          {v, v == m.targets, row0, std::vector<int32_t>(size_t(blocks_->block_elements(v)))});
    };
    if (const auto& pl = step_.c.pipelining) {
      const int64_t rows = cfg_.train.batch_size / pl->microbatches;
      for (size_t k = 0; k < pl->inputs.size(); ++k)
        for (size_t j = 0; j < pl->inputs[k].size(); ++j) {
          add(pl->inputs[k][j], int64_t(k) * rows);
          // the last micro-batch's inputs are the model's own (pipeline_micro_batches)
          batch_blocks_.back().targets = pl->inputs.back()[j] == m.targets;
        }
    } else {
      add(m.tokens, 0);
      add(m.targets, 0);
    }
  }
  exec_ = std::make_unique<runtime::Executor>(prog.graph);
  exec_->set_comms(&comms);
  const int hyper = step_.c.optimizer.hyper;
  const passes::Accumulation* accum = step_.accumulation();
  std::map<int, float*> state_buf;  // global state value -> this rank's block of it
  for (const ir::Value& v : g.values()) {
    if (v.kind == ir::ValueKind::node) continue;
    const int local = prog.local[size_t(v.id)];
    const int64_t n = blocks_->block_elements(v.id);
    if (v.kind == ir::ValueKind::param) {
      if (blocks_->sharding(v.id).is_replicated())
        exec_->bind(local, params_.data(v.name));
      else if (share)
        exec_->bind(local, blocks_->share_param(v.name, *share->blocks_));
      else
        exec_->bind(local, blocks_->own_param(v.name, params_));
    } else if (BatchBlock* bb = batch_block(v.id)) {
      exec_->bind(local, bb->block.data());
    } else if (v.id == hyper) {
      exec_->bind(local, hyper_buf_);
    } else if (accum && (v.id == accum->keep || v.id == accum->scale)) {
      exec_->bind(local, &accum_buf_[v.id == accum->keep ? 0 : 1]);
    } else if (v.kind == ir::ValueKind::state) {
      state_buf[v.id] = device_floats(n);
      exec_->bind(local, state_buf[v.id]);
    } else {
      LOOM_CHECK(false) << "unbound graph input %" << v.name;
    }
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) out_local_[g.outputs()[i]] = prog.outputs[i];
  for (auto [key, st] : step_.c.optimizer.moments) {
    MomentKey k{g.value(key.first).name, key.second};
    moment_value_[k] = st;
    moment_of_[k] = state_buf.at(st);
  }
}

std::vector<HeldTensor> StepRunner::held_tensors() const {
  LOOM_CHECK(blocks_ && mode_ == Mode::train) << "held_tensors() of a sharded training runner";
  const ir::Graph& g = graph();
  auto sharding = [&](int v) {
    shard::Sharding s = blocks_->sharding(v);
    s.partial.clear();
    return s;
  };
  std::vector<HeldTensor> held;
  for (const auto& p : params_.infos()) {
    const int v = g.find(p.name);
    const bool split = blocks_->params().count(p.name) > 0;
    held.push_back({"model", p.name, p.stored_shape(), p.shape, sharding(v),
                    split ? blocks_->params().at(p.name) : params_.data(p.name)});
  }
  for (const auto& p : params_.infos())
    for (autodiff::Moment which : autodiff::kMoments) {
      const MomentKey k{p.name, which};
      held.push_back({"optimizer", autodiff::moment_state_name(which, p.name), p.stored_shape(),
                      p.shape, sharding(moment_value_.at(k)), moment_of_.at(k)});
    }
  return held;
}

comm::Communicator& StepRunner::world() const {
  LOOM_CHECK(blocks_) << "world() of a runner without a plan";
  return blocks_->world();
}

StepRunner::BatchBlock* StepRunner::batch_block(int v) {
  for (BatchBlock& b : batch_blocks_)
    if (b.value == v) return &b;
  return nullptr;
}

int64_t StepRunner::owner_stage(const std::string& param) const {
  const auto& pl = step_.c.pipelining;
  if (!pl || !blocks_) return -1;
  return pl->param_stage(graph().find(param));
}

void StepRunner::from_owner(const std::string& param, float* p, int64_t n) const {
  const int64_t owner = owner_stage(param);
  if (owner < 0) return;
  comms_->axis(step_.c.pipelining->axis).broadcast(p, n * 4, int(owner));
}

void StepRunner::refresh_stage_replicas() {
  if (!step_.c.pipelining || !blocks_) return;
  const ir::Graph& g = graph();
  for (const auto& info : params_.infos()) {
    const int v = g.find(info.name);
    const bool split = blocks_->params().count(info.name) > 0;
    from_owner(info.name, split ? blocks_->params().at(info.name) : params_.data(info.name),
               blocks_->block_elements(v));
    if (mode_ != Mode::train) continue;
    for (autodiff::Moment which : autodiff::kMoments) {
      const MomentKey k{info.name, which};
      from_owner(info.name, moment_of_.at(k), blocks_->block_elements(moment_value_.at(k)));
    }
  }
}

void StepRunner::push_params() {
  refresh_stage_replicas();
  if (blocks_) blocks_->push(params_);
  for (auto& [name, p] : param_copy_)
    dev_.download(params_.data(name), p, numel(params_.info(name).shape) * 4);
}

void StepRunner::pull_params() {
  if (blocks_) blocks_->pull(params_);
  for (auto& [name, p] : param_copy_)
    dev_.upload(p, params_.data(name), numel(params_.info(name).shape) * 4);
}

void StepRunner::release_params() {
  if (blocks_) blocks_->release(params_);
}

StepRunner::StateBytes StepRunner::state_bytes() const {
  const ir::Graph& p = exec_->graph();
  auto bytes = [&](int v) { return runtime::value_bytes(p.value(v)); };
  StateBytes b;
  for (const ir::Value& v : p.values()) {
    if (v.kind == ir::ValueKind::param) b.params += bytes(v.id);
    if (v.kind == ir::ValueKind::state) b.moments += bytes(v.id);
  }
  for (const ir::Node& n : p.nodes())
    if (ops::has_trait(n.op, ops::Trait::optimizer)) b.grads += bytes(n.inputs[1]);
  if (const passes::Accumulation* a = step_.accumulation())
    for (auto [param, sum] : a->sums) {  // a state, but gradients' memory
      const int local = step_.c.rank.local[size_t(sum)];
      b.moments -= bytes(local);
      b.grads += bytes(local);
    }
  return b;
}

StepRunner::~StepRunner() = default;

float StepRunner::step(const int32_t* tokens) { return step(tokens, cfg_.optim.lr); }

float* StepRunner::moment_ptr(const std::string& param, autodiff::Moment which) {
  auto it = moment_of_.find({param, which});
  LOOM_CHECK(it != moment_of_.end()) << "no optimizer moment for " << param;
  return it->second;
}

void StepRunner::read_moment(const std::string& param, autodiff::Moment which, float* full) {
  float* m = moment_ptr(param, which);
  if (!blocks_) {
    dev_.download(full, m, numel(graph().value(graph().find(param)).type.shape) * 4);
    return;
  }
  // a pipeline: every stage's block from the stage updating it first (the gather below takes
  // whichever rank's block it meets last)
  const int v = moment_value_.at({param, which});
  from_owner(param, m, blocks_->block_elements(v));
  auto all = blocks_->gather(v, m);
  std::memcpy(full, all.data(), all.size() * 4);
}

void StepRunner::write_moment(const std::string& param, autodiff::Moment which, const float* full) {
  float* m = moment_ptr(param, which);
  if (!blocks_) {
    dev_.upload(m, full, numel(graph().value(graph().find(param)).type.shape) * 4);
    return;
  }
  blocks_->take_block(moment_value_.at({param, which}), full, m);
}

int StepRunner::grad_of(const std::string& param) const {
  auto it = step_.c.grads.find(graph().find(param));
  LOOM_CHECK(it != step_.c.grads.end()) << "no gradient for " << param;
  return it->second;
}

std::vector<float> StepRunner::full_grad(const std::string& param) {
  const int d = grad_of(param);
  if (!blocks_) {
    const int64_t n = numel(graph().value(d).type.shape);
    const float* g = host_floats(*exec_, out(d), n);
    return {g, g + n};
  }
  return blocks_->gather(d, exec_->ptr<float>(out(d)));
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
  // Gradient accumulation (k = accum > 1): micro-batches 0 .. k-2 run the program's prefix that
  // adds their gradients into the sums, the last the whole program (passes::Accumulation).
  const int64_t k = step_.accum;
  double loss = 0;
  for (int64_t i = 0; i < k; ++i) {
    const bool last = i + 1 == k;
    load_rows(tokens + i * B * (T + 1));
    if (blocks_)  // this rank's block of the batch
      for (BatchBlock& bb : batch_blocks_)
        blocks_->take_block(bb.value, (bb.targets ? targets_ : inputs_).data() + bb.row0 * T,
                            bb.block.data());
    accum_buf_[0] = last ? 0.0f : 1.0f;
    accum_buf_[1] = float(1.0 / double(k));
    send_staged();
    if (last)
      exec_->run();
    else
      exec_->run(step_.micro_nodes());
    collect_forward_outputs(i);
    const float l = host_scalar(*exec_, out(step_.loss()));
    if (k == 1) return l;
    loss += l;
  }
  ce_loss_ = float(ce_loss_ / double(k));
  return float(loss / double(k));
}

void StepRunner::collect_forward_outputs(int64_t i) {
  const models::ModelGraph& m = step_.c.model;
  if (m.ce_loss < 0) return;  // a decode graph: no loss
  const float ce = host_scalar(*exec_, out(m.ce_loss));
  ce_loss_ = i == 0 ? ce : ce_loss_ + ce;
  if (m.moe_kept < 0) return;
  auto add = [&](int v, std::vector<float>& sum) {
    const size_t n = size_t(numel(graph().value(v).type.shape));
    const float* x = host_floats(*exec_, out(v), int64_t(n));
    if (i == 0)
      sum.assign(x, x + n);
    else
      for (size_t j = 0; j < n; ++j) sum[j] += x[j];
  };
  add(m.moe_kept, load_.kept);
  add(m.moe_routed, load_.routed);
}

const float* StepRunner::logits() const {
  LOOM_CHECK(!blocks_) << "logits of a sharded run";
  // an eval step's logits are not one of its outputs: their buffer is reused after the loss
  LOOM_CHECK(mode_ != Mode::eval) << "the logits of an eval step are not kept: use Mode::infer";
  const int v = step_.c.model.logits;
  return host_floats(*exec_, out(v), numel(graph().value(v).type.shape));
}

const float* StepRunner::grad(const std::string& param) const {
  LOOM_CHECK(!blocks_) << "grad() of a sharded run: use full_grad()";
  const int d = grad_of(param);
  return host_floats(*exec_, out(d), numel(graph().value(d).type.shape));
}

float StepRunner::grad_norm() const {
  const int norm = step_.optimizer().grad_norm;
  LOOM_CHECK(norm >= 0);
  return host_scalar(*exec_, out(norm));
}

void StepRunner::set_trace(runtime::Trace* trace) { exec_->set_trace(trace); }

runtime::Executor::CommStats StepRunner::comm_stats() const { return exec_->comm_stats(); }

int64_t StepRunner::activation_bytes() const {
  std::vector<int> batch;
  for (int v : {step_.c.model.tokens, step_.c.model.targets})
    if (v >= 0) batch.push_back(step_.c.rank.local[size_t(v)]);
  return runtime::saved_activation_bytes(exec_->graph(), exec_->plan(), out(step_.loss()), batch);
}

int64_t StepRunner::planned_peak_bytes() const {
  return exec_->plan().arena_bytes + exec_->plan().external_bytes;
}

}  // namespace loom::train
