// The simulator's memory against the executor running the same program (issue: a check that
// recomputed the simulator's own formula could not disagree with it). The program is one
// process's training step, compiled as `loom plan` compiles it; the executor runs it on a device
// that hands out the CPU's memory and logs every allocation. Three things are measured, none of
// them from the memory plan's arithmetic:
//   - the most bytes allocated at once (the arena and every bound tensor, sized here from the
//     values' shapes) equals the simulator's planned bytes;
//   - no kernel writes past the arena: a poisoned guard after every allocation survives the run;
//   - the arena is used: the highest byte the run wrote lies in its last 10%.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "loom/core/dtype.h"
#include "loom/core/shape.h"
#include "loom/runtime/device.h"
#include "loom/runtime/executor.h"
#include "loom/sim/cluster.h"
#include "loom/sim/simulate.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom {
namespace {

constexpr unsigned char kPoison = 0xA5;
constexpr int64_t kGuard = 4096;

// The CPU's kernels and memory, every allocation logged, poisoned and followed by a guard.
class LoggingDevice final : public runtime::Device {
 public:
  runtime::DeviceKind kind() const override { return base().kind(); }
  const runtime::KernelTable& kernels() const override { return base().kernels(); }
  std::string describe() const override { return "cpu (logging)"; }
  bool host_memory() const override { return true; }
  int64_t memory_bytes() const override { return 0; }
  void* allocate(int64_t bytes) override {
    auto* p = static_cast<unsigned char*>(base().allocate(bytes + kGuard));
    std::memset(p, kPoison, size_t(bytes + kGuard));
    blocks_[p] = bytes;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return p;
  }
  void release(void* p) override {
    live_ -= blocks_.at(p);
    blocks_.erase(p);
    base().release(p);
  }
  void upload(void* d, const void* s, int64_t n) override { std::memcpy(d, s, size_t(n)); }
  void download(void* d, const void* s, int64_t n) override { std::memcpy(d, s, size_t(n)); }
  void copy(void* d, const void* s, int64_t n) override { std::memcpy(d, s, size_t(n)); }
  void zero(void* d, int64_t n) override { std::memset(d, 0, size_t(n)); }
  void synchronize() override {}
  int64_t peak_bytes() const override { return peak_; }

  // The allocation of exactly `bytes` (the arena), or null.
  const unsigned char* block_of(int64_t bytes) const {
    for (const auto& [p, n] : blocks_)
      if (n == bytes) return static_cast<const unsigned char*>(p);
    return nullptr;
  }
  // One past the highest byte of the block written since it was allocated.
  static int64_t high_water(const unsigned char* p, int64_t bytes) {
    int64_t i = bytes;
    while (i > 0 && p[i - 1] == kPoison) --i;
    return i;
  }
  static bool guard_intact(const unsigned char* p, int64_t bytes) {
    for (int64_t i = bytes; i < bytes + kGuard; ++i)
      if (p[i] != kPoison) return false;
    return true;
  }

 private:
  static Device& base() { return runtime::cpu_device(); }
  std::map<void*, int64_t> blocks_;
  int64_t live_ = 0, peak_ = 0;
};

struct Case {
  const char* config;
  const char* dtype;
  const char* recompute;
};

class SimulatedMemory : public ::testing::TestWithParam<Case> {};

TEST_P(SimulatedMemory, IsWhatTheExecutorAllocatesAndTouches) {
  const Case c = GetParam();
  const train::Config cfg = train::load_config(
      std::string(LOOM_SOURCE_DIR) + "/configs/" + c.config + ".toml",
      {std::string("model.dtype=") + c.dtype, std::string("passes.recompute=") + c.recompute,
       "train.batch_size=2", "train.seq_len=32"});
  const train::CompiledStep step = train::compile_step(cfg, passes::StepKind::train, false, 0);
  const ir::Graph& g = step.c.rank.graph;
  const sim::Cluster cl =
      sim::load_cluster(std::string(LOOM_SOURCE_DIR) + "/clusters/h100-sxm.toml");
  sim::SimOptions so;
  so.mpi_ranks = false;
  const sim::Prediction p = sim::simulate(g, shard::Mesh{}, cl, sim::Placement{}, so);

  LoggingDevice dev;
  {
    runtime::Executor ex(g, dev);
    std::vector<runtime::Buffer> bound;
    for (const ir::Value& v : g.values()) {
      if (v.kind == ir::ValueKind::node) continue;
      const int64_t bytes = numel(v.type.shape) * int64_t(dtype_size(v.type.dtype));
      bound.emplace_back(dev, bytes);
      if (bytes > 0) {
        dev.zero(bound.back().data(), bytes);  // zero weights, token 0, a zero learning rate
        ex.bind(v.id, bound.back().data());
      }
    }
    ex.run();
    EXPECT_EQ(p.planned_bytes, dev.peak_bytes())
        << "the simulator's memory against what running its program allocated";
    const int64_t arena = ex.plan().arena_bytes;
    ASSERT_GT(arena, 0);
    const unsigned char* a = dev.block_of(arena);
    ASSERT_NE(a, nullptr);
    EXPECT_TRUE(LoggingDevice::guard_intact(a, arena)) << "a kernel wrote past the arena";
    const int64_t hw = LoggingDevice::high_water(a, arena);
    EXPECT_GE(double(hw), 0.9 * double(arena)) << "written up to byte " << hw << " of " << arena;
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, SimulatedMemory,
                         ::testing::Values(Case{"tiny-llama", "f32", "none"},
                                           Case{"tiny-llama", "bf16", "none"},
                                           Case{"tiny-llama", "bf16", "selective"},
                                           Case{"tiny-gpt2", "f32", "full"},
                                           Case{"tiny-moe", "bf16", "none"}),
                         [](const auto& info) {
                           std::string s = std::string(info.param.config) + "_" + info.param.dtype +
                                           "_" + info.param.recompute;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace loom
