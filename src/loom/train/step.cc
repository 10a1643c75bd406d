#include "loom/train/step.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "loom/autodiff/autodiff.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/ops/verify.h"

namespace loom::train {

namespace {

// What a plan cannot be combined with yet.
void require_plannable(const Config& cfg) {
  if (cfg.train.grad_accum > 1)
    throw Error(fmt::format("{}: [train] grad_accum > 1 with a [plan] is not supported yet", cfg.path),
                "raise [train] batch_size instead: the plan splits it across ranks");
}

}  // namespace

void check_plan(const Config& cfg) {
  require_plannable(cfg);
  models::ModelGraph m = models::build_model(cfg.model, cfg.train.batch_size, cfg.train.seq_len);
  autodiff::build_train_step(m.graph, m.loss, cfg.optim);
  shard::shard_graph(m.graph, cfg.plan.plan, {.batch_inputs = {m.tokens, m.targets}},
                     cfg.plan.plan.mesh.size());
}

StepRunner::StepRunner(const Config& cfg, ParamStore& params, Mode mode,
                       const runtime::MeshComms* comms, StepRunner* share)
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
    if (comms && !cfg.plan.plan.empty()) require_plannable(cfg);
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
  inputs_.resize(size_t(B * T));
  targets_.resize(size_t(B * T));
  out_loss_ = model_.loss;
  if (comms && !cfg.plan.plan.empty()) {
    std::map<int, float*> state_buf = shard_program(comms, share);
    for (const auto& [prefix, pairs] : {std::pair{"m:", ts.moments_m}, std::pair{"v:", ts.moments_v}})
      for (auto [p, st] : pairs) {
        state_of_[prefix + g.value(p).name] = st;
        moment_of_[prefix + g.value(p).name] = state_buf.at(st);
      }
    return;
  }
  exec_ = std::make_unique<runtime::Executor>(g);
  for (const auto& p : params_.infos()) exec_->bind(g.find(p.name), params_.data(p.name));
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

std::map<int, float*> StepRunner::shard_program(const runtime::MeshComms* comms, StepRunner* share) {
  const ir::Graph& g = model_.graph;
  sharded_ = std::make_unique<RankState>();
  RankState& sh = *sharded_;
  sh.comms = comms;
  sh.plan = shard::shard_graph(g, cfg_.plan.plan, {.batch_inputs = {model_.tokens, model_.targets}},
                               comms->world().size());
  const shard::Program& prog = sh.plan.program;
  const shard::Mesh& mesh = cfg_.plan.plan.mesh;
  exec_ = std::make_unique<runtime::Executor>(prog.graph);
  exec_->set_comms(comms);
  std::map<int, float*> state_buf;  // global state value -> this rank's block of it
  for (const ir::Value& v : g.values()) {
    if (v.kind == ir::ValueKind::node) continue;
    const int local = prog.local[size_t(v.id)];
    const shard::Sharding& s = sh.plan.propagation.value[size_t(v.id)];
    const int64_t n = numel(prog.graph.value(local).type.shape);
    if (v.kind == ir::ValueKind::param) {
      if (s.is_replicated()) {
        exec_->bind(local, params_.data(v.name));
      } else if (share) {
        LOOM_CHECK(share->sharded_ && share->sharded_->param_ptr.count(v.name) &&
                   share->sharded_->plan.propagation.value[size_t(share->model_.graph.find(v.name))] == s)
            << "a runner sharing parameter blocks must split %" << v.name << " the same way";
        sh.param_ptr[v.name] = share->sharded_->param_ptr.at(v.name);
        exec_->bind(local, sh.param_ptr[v.name]);
      } else {
        auto& buf = sh.params[v.name];
        buf.resize(size_t(n));
        shard::copy_block(params_.data(v.name), buf.data(), v.type.shape, 4, s, mesh, sh.rank());
        sh.param_ptr[v.name] = buf.data();
        exec_->bind(local, buf.data());
      }
    } else if (v.id == model_.tokens || v.id == model_.targets) {
      auto& buf = v.id == model_.tokens ? sh.tokens : sh.targets;
      buf.resize(size_t(n));
      exec_->bind(local, buf.data());
    } else if (v.id == hyper_) {
      exec_->bind(local, hyper_buf_);
    } else if (v.kind == ir::ValueKind::state) {
      moments_.emplace_back(size_t(n), 0.0f);
      exec_->bind(local, moments_.back().data());
      state_buf[v.id] = moments_.back().data();
    } else {
      LOOM_CHECK(false) << "unbound graph input %" << v.name;
    }
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) out_local_[g.outputs()[i]] = prog.outputs[i];
  out_loss_ = out_local_.at(model_.loss);
  return state_buf;
}

std::vector<float> StepRunner::gather(int v, const float* local) {
  const RankState& sh = *sharded_;
  const ir::TensorType& t = model_.graph.value(v).type;
  shard::Sharding s = sh.plan.propagation.value[size_t(v)];
  s.partial.clear();
  const shard::Mesh& mesh = cfg_.plan.plan.mesh;
  const int64_t n = numel(shard::local_shape(t.shape, s, mesh));
  comm::Communicator& world = sh.comms->world();
  std::vector<float> all(size_t(n * world.size())), full(size_t(numel(t.shape)));
  world.all_gather(local, all.data(), n * 4);
  for (int r = 0; r < world.size(); ++r)
    shard::copy_block_back(all.data() + r * n, full.data(), t.shape, 4, s, mesh, r);
  return full;
}

void StepRunner::push_params() {
  if (!sharded_) return;
  for (auto& [name, ptr] : sharded_->param_ptr) {
    auto full = gather(model_.graph.find(name), ptr);
    params_.restore(name);
    std::memcpy(params_.data(name), full.data(), full.size() * 4);
  }
}

void StepRunner::pull_params() {
  if (!sharded_) return;
  for (auto& [name, ptr] : sharded_->param_ptr) {
    int v = model_.graph.find(name);
    shard::copy_block(params_.data(name), ptr, model_.graph.value(v).type.shape, 4,
                      sharded_->plan.propagation.value[size_t(v)], cfg_.plan.plan.mesh,
                      sharded_->rank());
  }
}

void StepRunner::release_params() {
  if (!sharded_) return;
  for (auto& [name, ptr] : sharded_->param_ptr) params_.release(name);
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
    if (n.op == "adamw") b.grads += bytes(n.inputs[1]);
  return b;
}

StepRunner::~StepRunner() = default;

float StepRunner::step(const int32_t* tokens) { return step(tokens, cfg_.optim.lr); }

float* StepRunner::moment_ptr(const std::string& param, int which) {
  auto it = moment_of_.find((which == 0 ? "m:" : "v:") + param);
  LOOM_CHECK(it != moment_of_.end()) << "no optimizer moment for " << param;
  return it->second;
}

void StepRunner::read_moment(const std::string& param, int which, float* full) {
  const float* m = moment_ptr(param, which);
  if (!sharded_) {
    std::memcpy(full, m, size_t(numel(model_.graph.value(model_.graph.find(param)).type.shape)) * 4);
    return;
  }
  auto all = gather(state_of_.at((which == 0 ? "m:" : "v:") + param), m);
  std::memcpy(full, all.data(), all.size() * 4);
}

void StepRunner::write_moment(const std::string& param, int which, const float* full) {
  float* m = moment_ptr(param, which);
  const ir::Value& pv = model_.graph.value(model_.graph.find(param));
  if (!sharded_) {
    std::memcpy(m, full, size_t(numel(pv.type.shape)) * 4);
    return;
  }
  int v = state_of_.at((which == 0 ? "m:" : "v:") + param);
  shard::copy_block(full, m, pv.type.shape, 4, sharded_->plan.propagation.value[size_t(v)],
                    cfg_.plan.plan.mesh, sharded_->rank());
}

std::vector<float> StepRunner::full_grad(const std::string& param) {
  auto it = grad_of_.find(param);
  LOOM_CHECK(it != grad_of_.end()) << "no gradient for " << param;
  if (!sharded_) {
    const float* g = exec_->ptr<float>(it->second);
    return {g, g + numel(model_.graph.value(it->second).type.shape)};
  }
  return gather(it->second, exec_->ptr<float>(out_local_.at(it->second)));
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
    if (sharded_) {  // this rank's block of the batch
      const auto& pv = sharded_->plan.propagation.value;
      const Shape& shape = model_.graph.value(model_.tokens).type.shape;
      shard::copy_block(inputs_.data(), sharded_->tokens.data(), shape, 4,
                        pv[size_t(model_.tokens)], cfg_.plan.plan.mesh, sharded_->rank());
      shard::copy_block(targets_.data(), sharded_->targets.data(), shape, 4,
                        pv[size_t(model_.targets)], cfg_.plan.plan.mesh, sharded_->rank());
    }
    exec_->run();
    return *exec_->ptr<float>(out_loss_);
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

const float* StepRunner::logits() const {
  LOOM_CHECK(!sharded_) << "logits of a sharded run";
  return exec_->ptr<float>(model_.logits);
}

const float* StepRunner::grad(const std::string& param) const {
  LOOM_CHECK(!sharded_) << "grad() of a sharded run: use full_grad()";
  auto it = grad_of_.find(param);
  LOOM_CHECK(it != grad_of_.end()) << "no gradient for " << param;
  return exec_->ptr<float>(it->second);
}

float StepRunner::grad_norm() const {
  LOOM_CHECK(grad_norm_ >= 0);
  if (sharded_) return *exec_->ptr<float>(out_local_.at(grad_norm_));
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
