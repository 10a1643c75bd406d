#include "loom/autodiff/autodiff.h"

#include <fmt/format.h>

#include <set>

#include "loom/core/error.h"

namespace loom::autodiff {

std::map<int, int> gradients(ops::Builder& b, int loss, const std::vector<int>& wrt,
                             std::vector<int>* origin) {
  ir::Graph& g = b.graph();
  if (g.value(loss).type != ir::TensorType{DType::f32, {}})
    throw Error(fmt::format("autodiff: loss %{} must be an f32 scalar", g.value(loss).name));
  const int n_nodes = int(g.nodes().size());

  // Values that depend on something in wrt (forward reachability).
  std::vector<bool> depends(g.values().size(), false);
  for (int v : wrt) depends[v] = true;
  for (int i = 0; i < n_nodes; ++i) {
    const ir::Node& n = g.node(i);
    bool any = false;
    for (int in : n.inputs) any = any || depends[in];
    if (any)
      for (int out : n.outputs) depends[out] = true;
  }

  std::vector<int> from(size_t(n_nodes), -1);  // origin, as it grows
  // the nodes appended since the last call come from forward node `o`
  auto mark = [&](int o) { from.resize(g.nodes().size(), o); };
  std::vector<int> grad(g.values().size(), -1);
  grad[loss] = b.emit1(ir::Op::fill, {}, {{"shape", Shape{}}, {"value", 1.0}}, "grad.seed");
  mark(g.value(loss).kind == ir::ValueKind::node ? g.value(loss).producer : -1);
  auto accumulate = [&](int v, int d) {
    if (grad[v] < 0) {
      grad[v] = d;
      return;
    }
    // Contributions are summed in f32; the sum stays f32 when any contribution was f32 (a gradient
    // may be wider than its value: see matmul's VJP), else it returns to the value's dtype.
    DType t = b.type(grad[v]).dtype == DType::f32 || b.type(d).dtype == DType::f32
                  ? DType::f32
                  : b.type(v).dtype;
    int s = b.add(b.cast(grad[v], DType::f32), b.cast(d, DType::f32), "grad.acc");
    grad[v] = b.cast(s, t);
  };

  for (int i = n_nodes - 1; i >= 0; --i) {
    const ir::Node n = g.node(i);  // copy: emitting nodes may reallocate the node list
    bool needed = false;
    for (int in : n.inputs) needed = needed || depends[in];
    if (!needed) continue;
    std::vector<int> d;
    bool any = false;
    for (int out : n.outputs) {
      d.push_back(grad[out]);
      any = any || grad[out] >= 0;
    }
    if (!any) continue;
    const ops::OpDef& def = ops::op_def(n.op);
    if (!def.vjp)
      throw Error(fmt::format("autodiff: op {} (producing %{}) has no gradient", n.op,
                              g.value(n.outputs[0]).name));
    std::vector<int> dins = def.vjp(b, n, d);
    LOOM_CHECK(dins.size() == n.inputs.size()) << n.op << " vjp returned " << dins.size();
    mark(i);
    for (size_t k = 0; k < dins.size(); ++k)
      if (dins[k] >= 0 && depends[n.inputs[k]]) {
        accumulate(n.inputs[k], dins[k]);
        const ir::Value& v = g.value(n.inputs[k]);
        mark(v.kind == ir::ValueKind::node ? v.producer : i);
      }
  }
  if (origin) *origin = from;

  std::map<int, int> r;
  for (int v : wrt) {
    if (grad[v] < 0)
      throw Error(fmt::format("autodiff: %{} does not affect the loss", g.value(v).name));
    if (g.value(v).kind != ir::ValueKind::node && g.value(grad[v]).kind == ir::ValueKind::node &&
        g.find("grad." + g.value(v).name) < 0)
      g.rename(grad[v], "grad." + g.value(v).name);
    r[v] = grad[v];
  }
  return r;
}

std::string moment_state_name(Moment which, const std::string& param) {
  return (which == Moment::m ? "adam.m." : "adam.v.") + param;
}

TrainStep add_optimizer(ir::Graph& g, const std::map<int, int>& grads, const AdamWConfig& cfg) {
  ops::Builder b(g);
  std::vector<int> params = g.inputs_of_kind(ir::ValueKind::param);
  TrainStep ts;
  b.set_scope("optim.");
  int total = -1;
  for (int p : params) {
    int s = b.emit1(ir::Op::sumsq, {grads.at(p)});
    total = total < 0 ? s : b.add(total, s);
  }
  auto cn =
      b.emit(ir::Op::clip_coef, {total}, {{"max_norm", cfg.grad_clip}}, {"clip_coef", "grad_norm"});
  ts.grad_norm = cn[1];
  ts.hyper = g.add_input("optim.hyper", {DType::f32, {3}}, ir::ValueKind::input);
  for (int p : params) {
    const ir::Value& pv = g.value(p);
    std::string name = pv.name;
    ir::TensorType t = pv.type;
    int m = g.add_input(moment_state_name(Moment::m, name), t, ir::ValueKind::state);
    int v = g.add_input(moment_state_name(Moment::v, name), t, ir::ValueKind::state);
    ts.moments[{p, Moment::m}] = m;
    ts.moments[{p, Moment::v}] = v;
    double wd = t.shape.size() >= 2 ? cfg.weight_decay : 0.0;
    b.set_scope("");
    b.emit(ir::Op::adamw, {p, grads.at(p), m, v, ts.hyper, cn[0]},
           {{"beta1", cfg.beta1}, {"beta2", cfg.beta2}, {"eps", cfg.eps}, {"wd", wd}},
           {"new." + name, "new.adam.m." + name, "new.adam.v." + name});
  }
  return ts;
}

TrainStep build_train_step(ir::Graph& g, int loss, const AdamWConfig& cfg) {
  ops::Builder b(g);
  std::map<int, int> grads = gradients(b, loss, g.inputs_of_kind(ir::ValueKind::param));
  TrainStep ts = add_optimizer(g, grads, cfg);
  ts.loss = loss;
  g.add_output(loss);
  g.add_output(ts.grad_norm);
  return ts;
}

}  // namespace loom::autodiff
