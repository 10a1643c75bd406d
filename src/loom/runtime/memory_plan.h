// Static memory planning: every value a node produces gets an offset in one arena, chosen by
// liveness so that values whose lifetimes do not overlap share bytes. Graph inputs (params, states,
// inputs) are external: the caller binds their buffers.
//
// Aliasing: a view op's output (reshape), an in-place op's outputs (adamw), and an output an op may
// compute in place (OpDef::reuse: add, swiglu_bwd, cross_entropy's dlogits, ...) when its input
// dies at that node, use their input's buffer; such values form one "root" whose lifetime covers
// all of them. Graph outputs live to the end.
//
// Placement is greedy best-fit by decreasing size: for each root, the lowest 64-byte-aligned offset
// that overlaps no already-placed root alive at the same time. Invariant (checked by the tests):
// two roots alive at one node never overlap in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::runtime {

struct MemoryPlan {
  std::vector<int> root;         // per value: the value whose buffer it uses (itself if its own)
  std::vector<int64_t> offset;   // per value: arena offset of its root; -1 when external
  std::vector<int> first, last;  // per root value: first and last node index it is alive at
  int64_t arena_bytes = 0;       // the planned peak of node-produced tensors
  int64_t external_bytes = 0;    // params, states and inputs
};

MemoryPlan plan_memory(const ir::Graph& g);
// Where the peak is: the node at which live arena bytes are largest, and the `top` largest values
// alive there grouped by name pattern (digits replaced by N), as readable text.
std::string memory_report(const ir::Graph& g, const MemoryPlan& p, int top = 12);
int64_t value_bytes(const ir::Value& v);
// The planned bytes of the activations a training step saves for its backward: arena buffers made
// from the batch (`batch`: the token and target inputs) that are alive across the node computing
// the loss (made before it, read after it). `loss` may be the loss after its collectives (a
// data-parallel rank's all-reduced loss): the count is taken at the local loss it reduces.
int64_t saved_activation_bytes(const ir::Graph& g, const MemoryPlan& p, int loss,
                               const std::vector<int>& batch);

}  // namespace loom::runtime
