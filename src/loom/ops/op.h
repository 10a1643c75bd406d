// The op registry: one OpDef per op declares, in one place, everything the compiler knows about it:
// type inference, the vector-Jacobian product (built from other ops), the cost, in-place aliasing,
// its sharding rule and its traits. Kernels live elsewhere (kernels/, dispatched by runtime/), so
// an op's meaning does not depend on a device. tests/op_coverage_test.cc walks this table and
// requires a kernel, a reference-interpreter case and a gradient-harness case (or a reasoned
// exemption) per op.
//
// Invariant: `infer` is total over user-reachable inputs: bad shapes throw loom::Error naming the
// op and the offending value types; it never aborts.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ops/sharding_rule.h"

namespace loom::ops {

class Builder;
using ir::Op;

struct Cost {
  double flops = 0;       // floating-point operations (a multiply-add counts 2)
  double bytes_read = 0;  // from tensors, assuming no cache reuse across kernels
  double bytes_written = 0;
};

// Properties code asks about an op, declared on the op (tinygrad's op groups) instead of compared
// against op names.
enum class Trait : uint8_t {
  collective,   // moves data between the ranks of a mesh axis (runtime/collectives.cc runs it)
  rank_local,   // reads this rank's mesh coordinate but moves nothing (shard_slice; runs there too)
  optimizer,    // updates a parameter in place from its gradient: inputs (param, grad, moments...)
  norm,         // normalises over the last dim (rmsnorm, layernorm, and their backward ops)
  elementwise,  // output element i reads input element i (a bias broadcast over rows included)
  view,         // output 0 is input 0's memory relabelled (reshape, wait); nothing is written;
                // further inputs are only kept alive
  completion,   // completes the asynchronous collective that produced input 0 (wait)
  p2p,          // point to point between two ranks of a mesh axis (send, recv: pipeline stages;
                // runtime/collectives.cc runs it), never made asynchronous by prefetch
};

class Traits {
 public:
  Traits() = default;
  Traits(std::initializer_list<Trait> ts) {
    for (Trait t : ts) bits_ |= 1u << unsigned(t);
  }
  bool has(Trait t) const { return bits_ & (1u << unsigned(t)); }

 private:
  uint32_t bits_ = 0;
};

using InferFn = std::function<std::vector<ir::TensorType>(const std::vector<ir::TensorType>&,
                                                          const ir::Attrs&)>;
// Given the node and the gradient of each of its outputs (-1 where an output has none), emit ops
// that compute the gradient of each input; return one value id per input (-1: no gradient, e.g.
// integer ids).
using VjpFn = std::function<std::vector<int>(Builder&, const ir::Node&, const std::vector<int>&)>;
using CostFn = std::function<Cost(const ir::Graph&, const ir::Node&)>;

struct OpDef {
  std::string name;  // as spelt in ir/op.h's list; the registry resolves it to `op`
  Op op{};
  int num_inputs = -1;  // -1: variadic (checked by infer)
  InferFn infer;
  VjpFn vjp;  // empty: not differentiable (using it in a differentiated path is an error)
  CostFn cost;
  // (output, input) pairs that share memory: the op overwrites the input, which nobody may read
  // after.
  std::vector<std::pair<int, int>> inplace;
  // (output, input) pairs the kernel can compute in place (exact aliasing). The memory planner puts
  // the output in the input's buffer when that input is dead after this node and has the same size.
  std::vector<std::pair<int, int>> reuse;
  ShardingRule sharding;  // empty: the op runs replicated
  Traits traits;
};

// An op's definition. The registry holds one per ir::Op (checked when it is first asked: an op in
// ir/op.h's list that no op file registers, or a registration of a name not in the list, stops
// the program at start-up with both named).
const OpDef& op_def(Op op);
// Whether op declares trait t.
bool has_trait(Op op, Trait t);
// Every op, in ir/op.h's order.
std::vector<Op> all_ops();
// The value that a chain of collectives (and the waits completing them) started from: `value`
// followed back through each collective's input and each wait's collective input until a node of
// another kind (or a graph input) made it. E.g. a data-parallel rank's all-reduced loss -> the
// rank's own loss.
int before_collectives(const ir::Graph& g, int value);
// Per value of g: the parameter it is, or that a chain of casts made it from (a bf16 weight's
// copy); -1 for any other value.
std::vector<int> param_roots(const ir::Graph& g);

// Registration, called once from the registry (explicit, so static linking never drops an op).
// `def.name` must be an op of ir/op.h's list not registered before.
void register_op(OpDef def);
void register_elementwise_ops();
void register_linear_ops();
void register_norm_ops();
void register_attention_ops();
void register_loss_ops();
void register_layout_ops();
void register_optim_ops();
void register_collective_ops();
void register_moe_ops();

// Helpers for infer functions.
void expect_inputs(std::string_view op, const std::vector<ir::TensorType>& in, size_t n);
[[noreturn]] void type_error(std::string_view op, const std::vector<ir::TensorType>& in,
                             const std::string& why);
// Cost of an elementwise-like op: reads all inputs, writes all outputs, `flops_per_elem` per output
// element of output 0.
Cost streaming_cost(const ir::Graph& g, const ir::Node& n, double flops_per_elem);

// split and concat along `axis` of a tensor of shape s: the rows before it and the elements after
// it, so that the op is the same along the last dim of an (rows, s[axis] * inner) view.
struct AxisView {
  int64_t axis = 0, rows = 1, inner = 1;
};
AxisView axis_view(const ir::Node& n, const Shape& s);

}  // namespace loom::ops
