// Reverse-mode autodiff over a Graph, and the training-step graph built with it.
//
// gradients() walks the nodes that lie on a path from a wanted value to the loss, last to first,
// asks each op's VJP for the gradients of its inputs, and sums contributions when a value is used
// more than once. It appends the backward nodes to the same graph, so forward values stay available
// to it. Not here: second derivatives (backward ops have no VJP), control flow (there is none in
// the IR).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ops/builder.h"

namespace loom::autodiff {

// Returns value id -> gradient id for every id in `wrt` (an f32 scalar `loss` is seeded with 1). A
// gradient has its value's shape and dtype, except that a bf16 value's gradient may be f32 (wider);
// VJPs cast an incoming gradient to the dtype their backward kernel needs.
// Gradients of params are named "grad.<param name>". Throws loom::Error naming a value in `wrt`
// that does not reach the loss.
// `origin` (when given) is resized to the graph's nodes and, for each node gradients() appended,
// set to the forward node it differentiates: a VJP's nodes to that node, the sum of a value's
// gradient contributions to the value's producer (the consumer being differentiated when the value
// is an input), the loss's seed to the loss's producer; -1 for every other node. Pipeline stages
// place a backward node where its forward node runs (passes/pipeline_stages.cc).
std::map<int, int> gradients(ops::Builder& b, int loss, const std::vector<int>& wrt,
                             std::vector<int>* origin = nullptr);

// AdamW's first (m) and second (v) moment: the graph's state "adam.m.P" / "adam.v.P" of param P.
enum class Moment { m, v };
inline constexpr Moment kMoments[] = {Moment::m, Moment::v};
std::string moment_state_name(Moment which, const std::string& param);  // "adam.m." + param

struct AdamWConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping ([optim] grad_clip: < 0 is refused)
};

// Turns a forward graph (params, inputs, a scalar loss) into one training step: forward, loss,
// backward, global-norm clipping, AdamW. Adds graph inputs "optim.hyper" f32[3] = {lr, 1-b1^t,
// 1-b2^t} and, per param P, states "adam.m.P" and "adam.v.P". Weight decay applies to params of
// rank >= 2 only. Graph outputs become: loss, grad_norm.
struct TrainStep {
  int loss = -1, grad_norm = -1, hyper = -1;
  std::map<std::pair<int, Moment>, int> moments;  // (param id, moment) -> state id
};
TrainStep build_train_step(ir::Graph& g, int loss, const AdamWConfig& cfg);
// The optimizer half alone: global-norm clipping and AdamW over every param of `g`, given each
// param's gradient value (param id -> gradient id). build_train_step is gradients + this; gradient
// accumulation runs it as its own graph whose gradients are inputs.
TrainStep add_optimizer(ir::Graph& g, const std::map<int, int>& grads, const AdamWConfig& cfg);

}  // namespace loom::autodiff
