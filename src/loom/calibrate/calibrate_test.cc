// The calibration front door called directly: a quick measurement of this machine, and imports of
// timed kernels (good, scaled and bad).
#include "loom/calibrate/calibrate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/testing.h"

namespace loom::calibrate {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("loom_calibrate_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

const std::string kBase = std::string(LOOM_SOURCE_DIR) + "/clusters/h100-sxm.toml";

TEST(Calibrate, QuickMeasurementHasEveryPart) {
  MeasureOptions o;
  o.quick = true;
  int lines = 0;
  o.progress = [&](const std::string&) { ++lines; };
  const Calibration c = measure(o);
  const sim::Device& d = c.cluster.device;
  EXPECT_GT(d.peak_flops.at(DType::f32), 0);
  EXPECT_GT(d.memory_bandwidth, 0);
  EXPECT_GT(d.runtime_bytes, 0);
  EXPECT_EQ(d.rank_runtime_bytes, d.runtime_bytes);  // no loom binary: not measured under mpirun
  ASSERT_TRUE(c.cluster.profile);
  const sim::Profile& p = *c.cluster.profile;
  EXPECT_FALSE(p.matmul.empty());
  for (ir::Op op : {ir::Op::add, ir::Op::rmsnorm, ir::Op::attention, ir::Op::adamw})
    EXPECT_TRUE(p.ops.count(op)) << op;
  for (ir::Op op :
       {ir::Op::all_gather, ir::Op::reduce_scatter, ir::Op::all_reduce, ir::Op::all_to_all})
    EXPECT_EQ(p.comm.at(op).size(), 2u) << op;  // 2 and 4 ranks, one size
  ASSERT_EQ(c.cluster.levels.size(), 1u);
  EXPECT_GT(c.cluster.levels[0].bandwidth, 0);
  EXPECT_NE(c.header.find("loom calibrate --quick"), std::string::npos);
  EXPECT_GT(lines, 4);
}

TEST(Calibrate, WattsBelowIdleAreRefused) {
  MeasureOptions o;
  o.idle_watts = 100;
  o.peak_watts = 50;
  EXPECT_THROW(measure(o), Error);
}

TEST(Calibrate, ImportScalesComputeAndMemoryKernelsApart) {
  const std::string timed = temp_path("timed.json");
  write(timed, R"({"device": "test GPU", "torch": "2.9", "kernels": [
    {"op": "add", "dtype": "bf16", "bytes": 1000, "flops": 0, "seconds": 4e-6},
    {"op": "attention", "dtype": "bf16", "bytes": 1000, "flops": 1e9, "seconds": 8e-6},
    {"op": "matmul", "dtype": "bf16", "seconds": 6e-6,
     "gemm": {"ta": 0, "tb": 1, "m": 64, "n": 32, "k": 16, "batch": 1}}]})");
  ImportOptions o{{timed}, kBase, 2, 4};
  const Calibration c = import_timed(o);
  ASSERT_TRUE(c.cluster.profile);
  const sim::Profile& p = *c.cluster.profile;
  EXPECT_DOUBLE_EQ(p.ops.at(ir::Op::add).at(0).seconds, 1e-6);        // memory-bound: / 4
  EXPECT_DOUBLE_EQ(p.ops.at(ir::Op::attention).at(0).seconds, 4e-6);  // compute-bound: / 2
  ASSERT_EQ(p.matmul.size(), 1u);
  EXPECT_DOUBLE_EQ(p.matmul[0].seconds, 3e-6);
  EXPECT_EQ(c.cluster.name, "h100-sxm-derived");
  EXPECT_NE(c.header.find("test GPU"), std::string::npos);
  std::filesystem::remove(timed);
}

TEST(Calibrate, BadImportsNameTheEntry) {
  const std::string timed = temp_path("bad.json");
  auto error_of = [&](const std::string& text) -> std::string {
    write(timed, text);
    return loom::error_of([&] { import_timed({{timed}, kBase, 1, 1}); });
  };
  EXPECT_NE(error_of(R"({"kernels": [{"op": "frobnicate", "dtype": "f32", "seconds": 1}]})")
                .find("kernels[0]: op: unknown op 'frobnicate'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kernels": []})").find("no kernels"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("\"kernels\" array"), std::string::npos);
  EXPECT_NE(error_of(R"({"runtime_bytes": -1, "kernels": [
    {"op": "add", "dtype": "f32", "bytes": 8, "flops": 0, "seconds": 1}]})")
                .find("runtime_bytes: expected a number >= 0"),
            std::string::npos);
  EXPECT_THROW(import_timed({{timed}, kBase, 0, 1}), Error);
  std::filesystem::remove(timed);
}

// Several files (one per model, say) make one profile, and the runtime's memory they measured the
// cluster's; files timed on different devices do not.
TEST(Calibrate, ImportMergesFilesOfOneDevice) {
  const std::string a = temp_path("a.json"), b = temp_path("b.json"), c = temp_path("c.json");
  write(a, R"({"device": "gpu A", "source": "Loom's own kernels", "runtime_bytes": 1e9, "kernels": [
    {"op": "add", "dtype": "bf16", "bytes": 1000, "flops": 0, "seconds": 4e-6}]})");
  write(b, R"({"device": "gpu A", "source": "Loom's own kernels", "runtime_bytes": 3e9, "kernels": [
    {"op": "add", "dtype": "bf16", "bytes": 8000, "flops": 0, "seconds": 9e-6},
    {"op": "matmul", "dtype": "bf16", "seconds": 6e-6,
     "gemm": {"ta": 0, "tb": 1, "m": 64, "n": 32, "k": 16, "batch": 1}}]})");
  write(c, R"({"device": "gpu B", "kernels": [
    {"op": "add", "dtype": "bf16", "bytes": 1000, "flops": 0, "seconds": 4e-6}]})");
  const Calibration m = import_timed({{a, b}, kBase, 1, 1});
  ASSERT_TRUE(m.cluster.profile);
  EXPECT_EQ(m.cluster.profile->ops.at(ir::Op::add).size(), 2u);
  EXPECT_EQ(m.cluster.profile->matmul.size(), 1u);
  EXPECT_NE(m.header.find("Loom's own kernels"), std::string::npos);
  EXPECT_DOUBLE_EQ(m.cluster.device.runtime_bytes, 3e9);  // the most either measured
  const std::string err = error_of([&] { import_timed({{a, c}, kBase, 1, 1}); });
  EXPECT_NE(err.find("gpu B"), std::string::npos) << err;
  EXPECT_NE(err.find("one device's"), std::string::npos) << err;
  for (const std::string& p : {a, b, c}) std::filesystem::remove(p);
}

// A kernel's scratch (loom bench --kernels-out on a GPU) comes in with its sample; the same
// kernel measured twice keeps the most it took; a negative one is refused naming the kernel.
TEST(Calibrate, ImportKeepsEachKernelsScratch) {
  const std::string a = temp_path("sa.json"), b = temp_path("sb.json");
  write(a, R"({"device": "gpu A", "kernels": [
    {"op": "attention_bwd", "dtype": "bf16", "bytes": 1e8, "flops": 1e11, "seconds": 3e-4,
     "scratch_bytes": 4.5e8},
    {"op": "add", "dtype": "bf16", "bytes": 1000, "flops": 0, "seconds": 4e-6}]})");
  write(b, R"({"device": "gpu A", "kernels": [
    {"op": "attention_bwd", "dtype": "bf16", "bytes": 1e8, "flops": 1e11, "seconds": 3e-4,
     "scratch_bytes": 5e8}]})");
  const Calibration m = import_timed({{a, b}, kBase, 1, 1});
  ASSERT_TRUE(m.cluster.profile);
  ASSERT_EQ(m.cluster.profile->ops.at(ir::Op::attention_bwd).size(), 1u);
  EXPECT_EQ(m.cluster.profile->ops.at(ir::Op::attention_bwd)[0].scratch_bytes, 5e8);
  EXPECT_EQ(m.cluster.profile->ops.at(ir::Op::add)[0].scratch_bytes, 0);
  write(b, R"({"device": "gpu A", "kernels": [
    {"op": "add", "dtype": "bf16", "bytes": 1e3, "flops": 0, "seconds": 4e-6, "scratch_bytes": -1}]})");
  const std::string err = error_of([&] { import_timed({{b}, kBase, 1, 1}); });
  EXPECT_NE(err.find("kernels[0]: scratch_bytes = -1"), std::string::npos) << err;
  for (const std::string& p : {a, b}) std::filesystem::remove(p);
}

TEST(Calibrate, CollectiveTimesArePositive) {
  EXPECT_GT(time_collective(ir::Op::all_reduce, 2, 1 << 16, 1), 0);
}

}  // namespace
}  // namespace loom::calibrate
