// Op coverage (ggml's test-backend-ops count): every op of ir/op.h must have
//   a kernel          a CPU kernel (runtime/cpu_dispatch.cc), or, for an op with trait collective
//   or
//                     rank_local, a collective kernel (runtime/collectives.cc);
//   a harness case    it appears in the forward of an op_grad_test case (its output checked against
//                     the f64 reference interpreter, its VJP against central differences), or in
//                     the backward autodiff builds for one (its kernel checked by those
//                     differences);
//   a reference       tests/reference_eval.cc evaluates it (the forward of the cases runs through
//   it);
// or a declared exemption below that says why and where the op is checked instead. An op added
// without them fails here, in the unit suite, instead of in a run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/device.h"
#include "op_cases.h"
#include "reference_eval.h"

namespace loom {
namespace {

// Ops with no harness case, and why. Each must still have a kernel.
const std::map<ir::Op, std::string>& exemptions() {
  using ir::Op;
  static const std::map<Op, std::string> e{
      {Op::adamw,
       "optimizer update, no VJP by design; golden_step_* checks 10 AdamW steps of every "
       "parameter against torch.optim.AdamW"},
      {Op::clip_coef,
       "optimizer's gradient clipping, no VJP by design; golden_step_* checks it against "
       "torch.nn.utils.clip_grad_norm_"},
      {Op::all_gather,
       "collective, inserted after autodiff (no VJP); reshard_test and plan_parity"},
      {Op::reduce_scatter,
       "collective, inserted after autodiff (no VJP); reshard_test and plan_parity"},
      {Op::all_reduce,
       "collective, inserted after autodiff (no VJP); reshard_test and plan_parity"},
      {Op::all_to_all,
       "collective, inserted after autodiff (no VJP); reshard_test and plan_parity"},
      {Op::shard_slice, "per-rank slice, inserted after autodiff (no VJP); reshard_test"},
      {Op::send,
       "a pipeline stage's value to another stage, inserted after autodiff (no VJP); "
       "plan_parity's PipelineParity cases and Pipeline tests, local and mpirun"},
      {Op::recv,
       "a value another pipeline stage sent, inserted after autodiff (no VJP); plan_parity's "
       "PipelineParity cases and Pipeline tests, local and mpirun"},
      {Op::shard_index,
       "per-rank token ids of a vocabulary-parallel embedding or loss, inserted after autodiff (no "
       "VJP); vocab_parallel_test and plan_parity (megatron)"},
      {Op::softmax_stats,
       "a vocabulary-parallel loss's per-block statistics, inserted after autodiff (no VJP); "
       "kernels_test's CrossEntropySplitOverTheVocabulary against the f64 reference, "
       "vocab_parallel_test and plan_parity (megatron)"},
      {Op::assign,
       "writes an optimizer result back after a reshard (no VJP); plan_parity (zero1/zero2)"},
      {Op::positions, "no input to differentiate; the GPT-2 golden tests check its use"},
      {Op::wait,
       "completes an asynchronous collective, inserted after autodiff (no VJP); plan_parity "
       "with [passes] prefetch"},
      // incremental decoding (inference only, no VJP by design): decode_test checks every decoded
      // position's logits against the full forward (itself checked against the reference and
      // PyTorch), attention_test the cached kernel against the f64 reference, kernels_test rope
      // from an offset against the full rope, bit for bit
      {Op::positions_at, "decoding's positions; decode_test (GPT-2) against the full forward"},
      {Op::rope_at, "decoding's rotary embedding; decode_test (Llama), kernels_test"},
      {Op::cached_attention, "decoding's attention; decode_test, attention_test (f64 reference)"},
  };
  return e;
}

struct Coverage {
  std::set<ir::Op> forward, backward;     // ops in the cases' forward and backward graphs
  std::vector<std::string> no_reference;  // cases whose forward the reference cannot evaluate
};

Coverage harness_coverage() {
  Coverage c;
  for (const OpCase& oc : cases()) {
    Harness h = build_harness(oc);
    for (const ir::Node& n : h.g.nodes())
      (n.id <= h.forward_end ? c.forward : c.backward).insert(n.op);
    std::map<int, std::vector<double>> zeros;
    for (const ir::Value& v : h.g.values())
      if (v.kind != ValueKind::node) zeros[v.id].assign(size_t(numel(v.type.shape)), 0.0);
    try {
      testing::eval_f64(h.g, zeros, h.forward_end);
    } catch (const Error& e) {
      c.no_reference.push_back(oc.name + ": " + e.what());
    }
  }
  return c;
}

TEST(OpCoverage, EveryOpHasAKernelAReferenceAndAHarnessCase) {
  const Coverage cov = harness_coverage();
  std::vector<std::string> missing;
  int covered = 0;
  for (const ir::Op op : ops::all_ops()) {
    const bool kernel = runtime::runs_on_comms(op) ? runtime::has_collective_kernel(op)
                                                   : runtime::cpu_kernels().find(op) != nullptr;
    if (!kernel) missing.push_back(fmt::format("{}: no kernel", op));
    const bool exempt = exemptions().count(op) != 0;
    if (cov.forward.count(op))
      ++covered;
    else if (cov.backward.count(op))
      ++covered;  // a backward op: checked through its forward op
    else if (!exempt)
      missing.push_back(
          fmt::format("{}: no op_grad_test case (tests/op_cases.h) and no exemption", op));
  }
  for (const auto& r : cov.no_reference) missing.push_back(r);
  std::printf("%d of %zu ops covered by harness cases, %zu exempt\n", covered,
              ops::all_ops().size(), exemptions().size());
  EXPECT_TRUE(missing.empty()) << ::testing::PrintToString(missing);
}

TEST(OpCoverage, ExemptionsNameRegisteredOpsWithoutCases) {
  const Coverage cov = harness_coverage();
  for (const auto& [op, why] : exemptions()) {
    EXPECT_FALSE(cov.forward.count(op) || cov.backward.count(op))
        << op << " has a harness case now: drop its exemption";
  }
}

// Declared traits agree with what the runtime does with an op.
TEST(OpCoverage, TraitsMatchTheRuntime) {
  for (const ir::Op op : ops::all_ops()) {
    const bool comm = ops::has_trait(op, ops::Trait::collective) ||
                      ops::has_trait(op, ops::Trait::rank_local) ||
                      ops::has_trait(op, ops::Trait::p2p);
    EXPECT_EQ(comm, runtime::has_collective_kernel(op)) << op;
    if (ops::has_trait(op, ops::Trait::optimizer)) {
      EXPECT_FALSE(ops::op_def(op).inplace.empty()) << op;
    }
    if (ops::has_trait(op, ops::Trait::view)) {
      EXPECT_GE(ops::op_def(op).num_inputs, 1) << op;  // output 0 is input 0's memory
    }
  }
}

// The op list is ir/op.h's alone: every id has exactly one definition, registered under its own
// spelling, and every spelling reads back as its id.
TEST(OpCoverage, EveryOpIdHasItsDefinition) {
  EXPECT_EQ(int(ops::all_ops().size()), ir::kOpCount);
  for (const ir::Op op : ops::all_ops()) {
    EXPECT_EQ(ops::op_def(op).op, op) << op;
    EXPECT_EQ(ops::op_def(op).name, ir::op_name(op));
    EXPECT_EQ(ir::find_op(ir::op_name(op)), op);
  }
  EXPECT_FALSE(ir::find_op("all_gahter"));
}

}  // namespace
}  // namespace loom
