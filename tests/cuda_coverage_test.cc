// The CUDA kernel table covers every op (cuda preset; needs no GPU: the table is only built): each
// op has a CUDA kernel, or is one of the exemptions below with its reason. tests/gpu_parity_test
// compares each kernel with the CPU's on a GPU.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "loom/ops/op.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/cuda/cuda_device.h"

namespace loom {
namespace {

TEST(CudaCoverage, EveryOpHasACudaKernelOrAReason) {
  const runtime::KernelTable table = runtime::cuda_kernels(nullptr);
  EXPECT_EQ(table.device(), runtime::DeviceKind::cuda);
  int kernels = 0, exempt = 0;
  for (const ir::Op op : ops::all_ops()) {
    if (table.find(op)) {
      ++kernels;
      // a collective runs on communicators, never through a device's table
      EXPECT_FALSE(runtime::runs_on_comms(op)) << op << ": a collective with a CUDA kernel";
      continue;
    }
    // the collectives: multi-GPU runs wait for NCCL behind the same nodes (one GPU has no
    // collective to run; a sharded step on a GPU is refused before it is compiled), and what only
    // a plan's lowering makes: the vocabulary-parallel loss's statistics (ops/loss.cc)
    EXPECT_TRUE(runtime::runs_on_comms(op) || op == ir::Op::softmax_stats)
        << op << ": no CUDA kernel and no exemption";
    ++exempt;
  }
  std::printf("%d ops with a CUDA kernel, %d collectives exempt\n", kernels, exempt);
}

}  // namespace
}  // namespace loom
