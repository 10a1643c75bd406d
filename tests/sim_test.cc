// The simulator (src/loom/sim/): cluster files (the shipped ones parse; bad ones fail naming the
// file and key), placing mesh axes on network levels, and properties of a prediction over real
// compiled programs: its bytes per axis are the program's collectives as `loom inspect` counts
// them, and no faster link (any bandwidth, any latency, of any level) makes a step slower. Its
// memory is checked against the executor running the same program in sim_memory_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/ir/text.h"
#include "loom/runtime/memory_plan.h"
#include "loom/sim/cost.h"
#include "loom/sim/simulate.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom::sim {
namespace {

namespace fs = std::filesystem;
const fs::path kClusters = fs::path(LOOM_SOURCE_DIR) / "clusters";

Cluster shipped(const std::string& name) { return load_cluster((kClusters / name).string()); }

// cfg's pipeline stages compiled (train::compile_stages) and simulated side by side on h.
std::vector<Prediction> simulate_stages(const train::Config& cfg, const Cluster& h) {
  const shard::Mesh& mesh = cfg.plan.plan.mesh;
  const std::vector<shard::Program> st =
      train::compile_stages(cfg, passes::StepKind::train, mesh.size());
  std::vector<const ir::Graph*> gs;
  for (const auto& s : st) gs.push_back(&s.graph);
  return simulate_pipeline(gs, mesh, h, place(mesh, h, mesh.size()));
}

TEST(Cluster, ShippedFilesParse) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kClusters)) {
    if (e.path().extension() != ".toml") continue;
    SCOPED_TRACE(e.path().string());
    const Cluster c = load_cluster(e.path().string());
    EXPECT_FALSE(c.levels.empty());
    EXPECT_GT(c.device.memory_bytes, 0);
    ++n;
  }
  EXPECT_GE(n, 6);  // local, h100-sxm, a100-80gb, h200, b200, mi300x
  const Cluster h = shipped("h100-sxm.toml");
  EXPECT_EQ(h.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(h.device.peak_flops.at(DType::bf16), 989.4e12);
  ASSERT_EQ(h.levels.size(), 2u);
  EXPECT_EQ(h.levels[0].size, 8);
}

// A written cluster (calibrate's output) reads back as it was.
TEST(Cluster, WriteReadsBack) {
  Cluster c = shipped("h100-sxm.toml");
  Profile p;
  p.threads = 2;
  p.matmul.push_back({0, 1, 128, 256, 512, 1, DType::bf16, 1.5e-4});
  p.ops[ir::Op::rmsnorm].push_back({DType::f32, 1e6, 2e5, 3e-5});
  p.ops[ir::Op::attention_bwd].push_back({DType::bf16, 1.7e8, 1.7e11, 7.5e-4, 1141899520});
  p.comm[ir::Op::all_reduce].push_back({4, 65536, 2e-5});
  c.profile = p;
  c.levels[1].comm[ir::Op::all_gather] = {{2, 65536, 3e-4}, {16, 1e6, 2e-3}};
  const std::string path = (fs::temp_directory_path() / "loom_sim_test_cluster.toml").string();
  write_cluster(c, path, "# test\n");
  const Cluster r = load_cluster(path);
  fs::remove(path);
  EXPECT_EQ(r.name, c.name);
  EXPECT_EQ(r.levels.size(), c.levels.size());
  ASSERT_TRUE(r.profile.has_value());
  EXPECT_EQ(r.profile->threads, 2);
  ASSERT_EQ(r.profile->matmul.size(), 1u);
  EXPECT_EQ(r.profile->matmul[0].n, 256);
  EXPECT_EQ(r.profile->matmul[0].dtype, DType::bf16);
  EXPECT_EQ(r.profile->ops.at(ir::Op::rmsnorm).size(), 1u);
  EXPECT_EQ(r.profile->ops.at(ir::Op::rmsnorm)[0].scratch_bytes, 0);
  EXPECT_EQ(r.profile->ops.at(ir::Op::attention_bwd)[0].scratch_bytes, 1141899520);
  EXPECT_EQ(r.profile->comm.at(ir::Op::all_reduce)[0].ranks, 4);
  EXPECT_TRUE(r.levels[0].comm.empty());
  ASSERT_EQ(r.levels[1].comm.at(ir::Op::all_gather).size(), 2u);
  EXPECT_EQ(r.levels[1].comm.at(ir::Op::all_gather)[1].ranks, 16);
  EXPECT_DOUBLE_EQ(r.levels[1].comm.at(ir::Op::all_gather)[1].seconds, 2e-3);
}

std::string error_of(const std::string& text) {
  try {
    parse_cluster(text, "bad.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kGood = R"(name = "t"
devices_per_node = 8
[device]
name = "d"
peak_flops = { bf16 = 1e15 }
memory_bytes = 8e10
memory_bandwidth = 3e12
idle_watts = 90
peak_watts = 700
[[level]]
name = "nvlink"
size = 8
bandwidth = 4e11
latency = 1e-6
[[level]]
name = "ib"
size = 0
bandwidth = 5e10
latency = 5e-6
)";

TEST(Cluster, BadFilesNameTheFileAndKey) {
  EXPECT_EQ(error_of(kGood), "");
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kGood;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {with("memory_bytes", "memroy_bytes"), "bad.toml: [device] memroy_bytes: unknown key"},
      {with("memory_bytes", "memroy_bytes"), "did you mean 'memory_bytes'"},
      {"colour = 1\n" + std::string(kGood), "bad.toml: colour: unknown key"},
      {with("[[level]]\nname = \"nvlink\"\nsize = 8\nbandwidth = 4e11\nlatency = 1e-6\n"
            "[[level]]\nname = \"ib\"\nsize = 0\nbandwidth = 5e10\nlatency = 5e-6\n",
            ""),
       "bad.toml: level: missing"},
      {with("bandwidth = 4e11\n", ""), "bad.toml: [level 0] bandwidth: missing"},
      {with("bandwidth = 4e11", "bandwidth = \"fast\""), "[level 0] bandwidth: expected a number"},
      {with("size = 0", "size = 12"), "[level 1] size: must be a multiple of the inner level's"},
      {with("peak_flops = { bf16 = 1e15 }", "peak_flops = { fp8 = 1e15 }"),
       "[device.peak_flops] fp8: unknown key"},
      {with("idle_watts = 90", "idle_watts = 900"),
       "[device] peak_watts: must be a finite number in [900, 1000000], got 700"},
      {with("name = \"t\"", "name = "), "bad.toml: not valid TOML"},
      {std::string(kGood) +
           "[profile]\nthreads = 1\nmatmul = [[0, 1, 1, 0, 8, 8, \"f32\", 1e-5]]\n",
       "bad.toml: [profile.matmul]: expected an integer in 1.."},
      {std::string(kGood) + "[profile]\nthreads = 1\nmatmul = [[0, 1, 1, 8, 8, 8, \"f32\", 0]]\n",
       "bad.toml: [profile.matmul]: expected a finite number in [1e-12, 1000000]"},
      // values a machine cannot have: each key has its bound (1e300 s of kernel overhead printed
      // a step of 300 digits; an f32 peak of 0 ran f32 at the bf16 peak)
      {with("peak_flops = { bf16 = 1e15 }", "peak_flops = { bf16 = 1e15, f32 = 0 }"),
       "[device.peak_flops] f32: must be a finite number in [1000000, 1e+18], got 0"},
      {std::string(kGood) + "[efficiency]\nmatmul = 3\n",
       "[efficiency] matmul: must be a finite number in [0.001, 1], got 3"},
      {std::string(kGood) + "[level.comm]\nall_gather = [[1, 65536, 1e-4]]\n",
       "bad.toml: [level 1 (ib).comm.all_gather]: expected an integer in 2.."},
      {std::string(kGood) + "[level.comm]\nall_gathr = [[2, 65536, 1e-4]]\n",
       "bad.toml: [level 1 (ib).comm.all_gathr]"},
  };
  for (const Case& c : cases) {
    const std::string got = error_of(c.text);
    EXPECT_NE(got.find(c.expect), std::string::npos)
        << "expected \"" << c.expect << "\", got \"" << got << "\"";
  }
  EXPECT_THROW(load_cluster("/nonexistent/cluster.toml"), Error);
}

TEST(Placement, AxesGoInnermostFirst) {
  const Cluster h = shipped("h100-sxm.toml");
  const Placement p = place(shard::Mesh({{"data", 16}, {"model", 8}}), h, 128);
  EXPECT_EQ(p.level.at("model"), 0);  // 8 neighbours: one node's NVLink
  EXPECT_EQ(p.level.at("data"), 1);   // across 16 nodes
  const Placement q = place(shard::Mesh({{"data", 4}, {"model", 2}}), h, 8);
  EXPECT_EQ(q.level.at("data"), 0);  // 4 x 2 = 8: still inside the node
  // a mesh larger than the devices, and an axis no level can hold
  try {
    place(shard::Mesh({{"data", 16}}), h, 8);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 16 devices"), std::string::npos) << e.what();
  }
  Cluster one_node = h;
  one_node.levels.pop_back();
  try {
    place(shard::Mesh({{"data", 16}}), one_node, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mesh axis data spans 16 devices"), std::string::npos)
        << e.what();
  }
}

TEST(Cost, CollectivesFollowTheRing) {
  Cluster h = shipped("h100-sxm.toml");
  const double b = 1e9, bw = h.levels[0].bandwidth, a = h.levels[0].latency;
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::all_gather, b, 8, h, 0), 7 * (a + b / bw));
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::reduce_scatter, b, 8, h, 0),
                   7 * a + 7.0 / 8 * b / bw);
  // all-reduce at its own bus bandwidth (NVLink SHARP), the ring's steps the same
  const double ar = h.levels[0].all_reduce_bandwidth;
  ASSERT_GT(ar, bw);
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::all_reduce, b, 8, h, 0), 14 * a + 14.0 / 8 * b / ar);
  EXPECT_EQ(collective_seconds(ir::Op::all_reduce, b, 1, h, 0), 0);
  // a small all-reduce over thousands of ranks: the tree's log-depth latency, not the ring's
  const double ib_a = h.levels[1].latency, ib_bw = h.levels[1].bandwidth;
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::all_reduce, 4, 4096, h, 1),
                   2 * 12 * ib_a + 2 * 4 / ib_bw);
}

// A level's measured collectives (Level::comm) price a collective of a measured rank count,
// interpolated in bytes; another rank count, or a kind not measured, is the ring's.
TEST(Cost, ALevelsMeasuredCollectivesPriceTheirRankCount) {
  Cluster c = shipped("two-hosts.toml");
  const double ring4 = collective_seconds(ir::Op::all_reduce, 4e6, 4, c, 1);
  c.levels[1].comm[ir::Op::all_reduce] = {{2, 1e6, 0.01}, {2, 16e6, 0.16}};
  EXPECT_NEAR(collective_seconds(ir::Op::all_reduce, 4e6, 2, c, 1, 2), 0.04, 1e-9);
  EXPECT_NEAR(collective_seconds(ir::Op::all_reduce, 32e6, 2, c, 1, 2), 0.32, 1e-9);  // its rate
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::all_reduce, 4e6, 4, c, 1), ring4);
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::all_gather, 4e6, 2, c, 1, 2),
                   c.levels[1].latency + 2 * 4e6 / c.levels[1].bandwidth);
}

// Two hosts of two ranks, one link between them (clusters/two-hosts.toml: shared_by = 2): the
// groups that cross it at once share it, counted from the ring each group runs.
TEST(Cost, ASharedLinkIsDividedAmongTheGroupsThatCrossIt) {
  const Cluster c = shipped("two-hosts.toml");
  ASSERT_EQ(c.levels.size(), 2u);
  ASSERT_EQ(c.levels[1].shared_by, 2);
  const shard::Mesh x({{"x", 4}});
  // the whole axis: ranks 0 1 | 2 3 in order, the ring crosses once each way
  EXPECT_EQ(link_load(ir::Op::all_reduce, x, c, 1, "x"), 1);
  // x's high digit: {0, 2} and {1, 3} cross at once, both from each host
  EXPECT_EQ(link_load(ir::Op::all_reduce, x, c, 1, "x[2:2]"), 2);
  // the same four ranks named low digit first: 0 2 1 3 around the ring, every edge across
  EXPECT_EQ(link_load(ir::Op::all_reduce, x, c, 1, "x[1:2]+x[2:2]"), 2);
  // all_to_all: each rank sends 2 of its 3 pieces across, two ranks a host
  EXPECT_DOUBLE_EQ(link_load(ir::Op::all_to_all, x, c, 1, "x"), 4.0 / 3);
  // on the innermost level every edge is its own device's
  EXPECT_EQ(link_load(ir::Op::all_reduce, x, c, 0, "x[1:2]"), 1);
  // the load multiplies the bandwidth term only
  const Level& l = c.levels[1];
  const double b = 64e6;
  EXPECT_DOUBLE_EQ(collective_seconds(ir::Op::reduce_scatter, b, 2, c, 1, 2),
                   l.latency + 2 * 0.5 * b / l.bandwidth);
  // a level whose links are the devices' own: no sharing, whatever the group
  Cluster own = c;
  own.levels[1].shared_by = 1;
  EXPECT_EQ(link_load(ir::Op::all_reduce, x, own, 1, "x[2:2]"), 1);
  // shared_by must divide the inner level
  std::string text = read_file((kClusters / "two-hosts.toml").string());
  text.replace(text.find("shared_by = 2"), 13, "shared_by = 3");
  EXPECT_NE(error_of(text).find("[level 1] shared_by: must divide the inner level's size 2"),
            std::string::npos)
      << error_of(text);
}

// A compiled program of a config under a plan, as loom plan compiles it.
shard::Program program(const std::string& config, const std::vector<std::string>& sets,
                       shard::Mesh* mesh) {
  const train::Config cfg =
      train::load_config(std::string(LOOM_SOURCE_DIR) + "/configs/" + config, sets);
  *mesh = cfg.plan.plan.mesh;
  return train::compile_step(cfg, passes::StepKind::train, true, mesh->size()).c.rank;
}

struct PlanCase {
  const char* name;
  std::vector<std::string> sets;
};
std::vector<PlanCase> plans() {
  return {
      {"fsdp",
       {"plan.mesh={data=2}",
        R"(plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}])"}},
      {"fsdp_sync",
       {"plan.mesh={data=2}",
        R"(plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}])",
        "passes.prefetch=false"}},
      {"megatron_fsdp",
       {"plan.mesh={data=2,model=2}",
        R"(plan.tactics=[{kind="megatron",axis="model"},{kind="fsdp",axis="data"},{kind="data",axis="data"}])"}},
  };
}

// A kernel's scratch (profile.h) is in the peak: the largest any node takes, at the size of the
// sample measured at its own bytes, and in proportion beyond the samples; none measured, none.
TEST(Simulate, PeakHoldsTheLargestKernelScratch) {
  Cluster h = shipped("h100-sxm.toml");
  shard::Mesh mesh;
  const shard::Program prog = program("tiny-llama.toml", {}, &mesh);
  const ir::Graph& g = prog.graph;
  const Placement place1 = place(mesh, h, 1);
  const Prediction none = simulate(g, mesh, h, place1);
  const ir::Node* bwd = nullptr;
  for (const ir::Node& n : g.nodes())
    if (n.op == ir::Op::rmsnorm_bwd) bwd = &n;
  ASSERT_NE(bwd, nullptr);
  const ops::Cost cost = ops::op_def(bwd->op).cost(g, *bwd);
  const double bytes = cost.bytes_read + cost.bytes_written;
  Profile p;
  p.ops[ir::Op::rmsnorm_bwd].push_back({node_dtype(g, *bwd), bytes, cost.flops, 1e-5, 5e6});
  h.profile = p;
  const Prediction with = simulate(g, mesh, h, place1);
  EXPECT_EQ(with.scratch_bytes, 5000000);
  EXPECT_EQ(with.peak_bytes - none.peak_bytes, 5000000 - none.scratch_bytes);
  h.profile->ops[ir::Op::rmsnorm_bwd][0].bytes = bytes / 4;  // measured on a quarter of the size
  EXPECT_EQ(simulate(g, mesh, h, place1).scratch_bytes, 20000000);
  h.profile->ops[ir::Op::rmsnorm_bwd][0].scratch_bytes = 0;
  EXPECT_EQ(simulate(g, mesh, h, place1).scratch_bytes, none.scratch_bytes);
}

TEST(Simulate, BytesPerAxisAreTheProgramsCollectives) {
  const Cluster h = shipped("h100-sxm.toml");
  for (const PlanCase& pc : plans()) {
    SCOPED_TRACE(pc.name);
    shard::Mesh mesh;
    const shard::Program prog = program("bench-llama.toml", pc.sets, &mesh);
    const Prediction p = simulate(prog.graph, mesh, h, place(mesh, h, mesh.size()));
    const auto counted = traffic(prog.graph);
    ASSERT_EQ(p.axis_traffic.size(), counted.size());
    int64_t n = 0;
    for (const auto& [axis, ops] : counted) {
      double bytes = 0;
      int64_t count = 0;
      for (const auto& [op, t] : ops) bytes += t.bytes, count += t.count;
      EXPECT_DOUBLE_EQ(p.axis_traffic.at(axis).bytes, bytes) << axis;
      EXPECT_EQ(p.axis_traffic.at(axis).count, count) << axis;
      n += count;
    }
    EXPECT_EQ(p.collectives, n);
    EXPECT_GT(p.step_seconds, 0);
    EXPECT_LE(p.exposed_comm_seconds, p.comm_seconds + 1e-12);
    // the compute stream's time, and at most the communication that runs on past it
    EXPECT_GE(p.step_seconds, (p.compute_seconds + p.exposed_comm_seconds) * (1 - 1e-12));
    EXPECT_LE(p.step_seconds, p.compute_seconds + p.exposed_comm_seconds + p.comm_seconds);
  }
}

// Every link figure a cluster file has, one at a time and all together: a bandwidth or an
// all-reduce bandwidth doubled, a latency halved, four times over, never makes a step slower (an
// all-reduce bandwidth that is 0, "as bandwidth", starts from the bandwidth). The files: one
// whose all-reduces run at their own bandwidth (NVLink SHARP) and three that have none.
enum class Knob { bandwidth, all_reduce_bandwidth, latency };
void improve(Level& l, Knob k) {
  switch (k) {
    case Knob::bandwidth:
      l.bandwidth *= 2;
      break;
    case Knob::all_reduce_bandwidth:
      l.all_reduce_bandwidth =
          2 * (l.all_reduce_bandwidth > 0 ? l.all_reduce_bandwidth : l.bandwidth);
      break;
    case Knob::latency:
      l.latency /= 2;
      break;
  }
}

TEST(Simulate, AFasterLinkNeverSlowsAStep) {
  const std::vector<std::pair<Knob, const char*>> knobs = {
      {Knob::bandwidth, "bandwidth"},
      {Knob::all_reduce_bandwidth, "all_reduce_bandwidth"},
      {Knob::latency, "latency"}};
  for (const char* file : {"h100-sxm.toml", "a100-80gb.toml", "h200.toml", "mi300x.toml"})
    for (const PlanCase& pc : plans()) {
      SCOPED_TRACE(std::string(file) + " " + pc.name);
      const Cluster c = shipped(file);
      shard::Mesh mesh;
      const shard::Program prog = program("bench-llama.toml", pc.sets, &mesh);
      const Placement pl = place(mesh, c, mesh.size());
      const double base = simulate(prog.graph, mesh, c, pl).step_seconds;
      // each knob of each level alone (level -1: every level at once), then all knobs together
      for (int level = -1; level < int(c.levels.size()); ++level)
        for (size_t k = 0; k <= knobs.size(); ++k) {
          const std::string what =
              (k < knobs.size() ? knobs[k].second : "every figure") + std::string(" of ") +
              (level < 0 ? std::string("every level") : c.levels[size_t(level)].name);
          Cluster faster = c;
          double prev = base;
          for (int i = 0; i < 4; ++i) {
            for (int l = 0; l < int(faster.levels.size()); ++l) {
              if (level >= 0 && l != level) continue;
              for (size_t j = 0; j < knobs.size(); ++j)
                if (j == k || k == knobs.size()) improve(faster.levels[size_t(l)], knobs[j].first);
            }
            const double t = simulate(prog.graph, mesh, faster, pl).step_seconds;
            EXPECT_LE(t, prev * (1 + 1e-12)) << what << " improved " << (2 << i) << "x";
            prev = t;
          }
        }
      // and a slow one makes communication show
      Cluster slow = c;
      for (Level& l : slow.levels) {
        l.bandwidth /= 1e4;
        l.all_reduce_bandwidth /= 1e4;
      }
      const Prediction s = simulate(prog.graph, mesh, slow, pl);
      EXPECT_GT(s.exposed_comm_seconds, 0.5 * s.comm_seconds - 1e-12);
    }
}

// [passes] bucket = "auto" keeps the candidate the simulator predicts fastest; block bucketing is
// one of them, so on the cluster it decided for, auto is never predicted slower than block (this
// checks that the program the pass emits is the one it simulated). And it decides by the link: on
// DGX H100 figures it merges blocks, on a 1 Gbit/s link it keeps one bucket per block.
// A CPU host's overlap (Level::comm_beside_compute, compute_beside_comm): the collectives and the
// kernels that run beside them slow each other; a program without overlap is untouched, and one
// with it lies between perfect overlap and none (each slowdown below 2x: a shared core's worst).
TEST(Simulate, OverlapOnACpuHostSlowsBothStreams) {
  Cluster c = shipped("two-hosts.toml");
  c.levels[0] = c.levels[1];  // one rank a host: every collective over the 1 Gbit/s link
  c.levels[0].size = 0;
  c.levels[0].shared_by = 1;
  c.levels.pop_back();
  for (const PlanCase& pc : plans()) {
    if (std::string(pc.name) == "megatron_fsdp") continue;  // 2 ranks
    SCOPED_TRACE(pc.name);
    shard::Mesh mesh;
    const shard::Program prog = program("bench-llama.toml", pc.sets, &mesh);
    const Placement pl = place(mesh, c, mesh.size());
    const Prediction base = simulate(prog.graph, mesh, c, pl);
    const bool overlaps = base.exposed_comm_seconds < base.comm_seconds * 0.99;
    EXPECT_EQ(overlaps, std::string(pc.name) == "fsdp");
    // the communication thread's pace: only a program that has one runs its collectives there
    Cluster polite = c;
    polite.levels[0].comm_thread_slowdown = 2;
    const Prediction p2 = simulate(prog.graph, mesh, polite, pl);
    EXPECT_NEAR(p2.comm_seconds, (overlaps ? 2 : 1) * base.comm_seconds, 1e-9 * base.comm_seconds);
    Cluster cpu = c;
    cpu.levels[0].comm_beside_compute = 1.7;
    cpu.levels[0].compute_beside_comm = 1.15;
    const Prediction slow = simulate(prog.graph, mesh, cpu, pl);
    EXPECT_DOUBLE_EQ(slow.comm_seconds, base.comm_seconds);
    if (!overlaps) {
      EXPECT_DOUBLE_EQ(slow.step_seconds, base.step_seconds);
      EXPECT_DOUBLE_EQ(slow.compute_seconds, base.compute_seconds);
      continue;
    }
    EXPECT_GT(slow.step_seconds, base.step_seconds * 1.01);
    EXPECT_GT(slow.compute_seconds, base.compute_seconds * 1.01);
    EXPECT_LE(slow.compute_seconds, base.compute_seconds * 1.15 * (1 + 1e-12));
    EXPECT_GT(slow.exposed_comm_seconds, base.exposed_comm_seconds);
    EXPECT_LE(slow.step_seconds, (base.compute_seconds + base.comm_seconds) * (1 + 1e-12));
    // each stream alone: the other's factor at 1
    Cluster only_comm = cpu;
    only_comm.levels[0].compute_beside_comm = 1;
    const Prediction oc = simulate(prog.graph, mesh, only_comm, pl);
    EXPECT_NEAR(oc.compute_seconds, base.compute_seconds, 1e-9 * base.compute_seconds);
    EXPECT_GT(oc.step_seconds, base.step_seconds);
    EXPECT_LE(oc.step_seconds, slow.step_seconds * (1 + 1e-12));
  }
}

// A level's skew (Level::skew): a collective the ranks come to from kernels waits for the last of
// them; one issued right after another finds them in step. Two of the three all_reduces below
// follow a matmul, so the step grows by exactly two skews, all of it exposed; at skew 0 nothing
// changes (a GPU's cluster), and the cluster file keeps it.
TEST(Simulate, ALevelsSkewDelaysEachCollectiveThatFollowsKernels) {
  Cluster c = shipped("local.toml");
  c.levels[0].skew = 0;
  const shard::Mesh mesh({{"m", 2}});
  const Placement pl = place(mesh, c, 2);
  const ir::Graph g = ir::parse(R"(graph skew {
  param %w : f32[512,512]
  input %x : f32[256,512]
  %h : f32[256,512] = matmul(%x, %w) {ta = 0, tb = 0}
  %a : f32[256,512] = all_reduce(%h) {axis = "m"}
  %b : f32[256,512] = all_reduce(%a) {axis = "m"}
  %h2 : f32[256,512] = matmul(%b, %w) {ta = 0, tb = 0}
  %c : f32[256,512] = all_reduce(%h2) {axis = "m"}
})");
  const Prediction base = simulate(g, mesh, c, pl);
  Cluster skewed = c;
  skewed.levels[0].skew = 3e-3;
  const Prediction s = simulate(g, mesh, skewed, pl);
  EXPECT_NEAR(s.step_seconds - base.step_seconds, 2 * 3e-3, 1e-12);
  EXPECT_NEAR(s.comm_seconds - base.comm_seconds, 2 * 3e-3, 1e-12);
  EXPECT_NEAR(s.exposed_comm_seconds - base.exposed_comm_seconds, 2 * 3e-3, 1e-12);
  EXPECT_DOUBLE_EQ(s.compute_seconds, base.compute_seconds);
  const std::string file = testing::TempDir() + "/skewed.toml";
  write_cluster(skewed, file, "# skewed\n");
  EXPECT_DOUBLE_EQ(load_cluster(file).levels[0].skew, 3e-3);
}

// A rank has two communication streams (runtime/executor.h), its host's and the network's:
// collectives of an axis within a node and of one across nodes run side by side, two of one axis
// one after the other, and so do two axes across nodes; what the compute stream waited for is
// told by collective and axis.
TEST(Simulate, CollectivesOfTwoAxesRunSideBySide) {
  const Cluster c = shipped("h100-sxm.toml");
  const shard::Mesh mesh({{"a", 2}, {"b", 8}});  // a across nodes (InfiniBand), b on NVLink
  const Placement pl = place(mesh, c, 16);
  auto program = [](const std::string& x_axis, int xn, const std::string& y_axis, int yn) {
    return ir::parse(fmt::format(R"(graph two {{
  param %x : f32[4194304]
  param %y : f32[4194304]
  %x.inflight : f32[{}] = all_gather(%x) {{async = 1, axis = "{}", dim = 0, n = {}}}
  %y.inflight : f32[{}] = all_gather(%y) {{async = 1, axis = "{}", dim = 0, n = {}}}
  %x.all : f32[{}] = wait(%x.inflight, %x)
  %y.all : f32[{}] = wait(%y.inflight, %y)
}})",
                                 4194304 * xn, x_axis, xn, 4194304 * yn, y_axis, yn, 4194304 * xn,
                                 4194304 * yn));
  };
  const Prediction ab = simulate(program("a", 2, "b", 8), mesh, c, pl);
  const Prediction aa = simulate(program("a", 2, "a", 2), mesh, c, pl);
  const Prediction bb = simulate(program("b", 8, "b", 8), mesh, c, pl);
  const double ta = aa.comm_seconds / 2, tb = bb.comm_seconds / 2;
  ASSERT_GT(ta, 0);
  ASSERT_GT(tb, 0);
  EXPECT_NEAR(ab.comm_seconds, ta + tb, 1e-9 * ta);
  EXPECT_NEAR(ab.step_seconds, std::max(ta, tb), 1e-9 * ta);  // side by side
  EXPECT_NEAR(aa.step_seconds, 2 * ta, 1e-9 * ta);            // one after the other
  EXPECT_NEAR(bb.step_seconds, 2 * tb, 1e-9 * tb);
  for (const Prediction* p : {&ab, &aa, &bb}) {
    double sum = 0;
    for (const auto& [what, s] : p->exposed_by) sum += s;
    EXPECT_NEAR(sum, p->exposed_comm_seconds, 1e-12);
    EXPECT_NEAR(p->exposed_comm_seconds, p->step_seconds, 1e-12);  // nothing but waiting
  }
  EXPECT_NEAR(aa.exposed_by.at("all_gather a"), 2 * ta, 1e-9 * ta);
  EXPECT_EQ(aa.exposed_by.size(), 1u);
  // the wait for x (slower, over InfiniBand) holds the whole step; y was done by then
  ASSERT_GT(ta, tb);
  EXPECT_NEAR(ab.exposed_by.at("all_gather a"), ta, 1e-9 * ta);
  EXPECT_EQ(ab.exposed_by.count("all_gather b"), 0u);
  // two axes across nodes take turns on the network's stream
  const shard::Mesh wide({{"a", 2}, {"c", 2}, {"b", 8}});
  const Placement pw = place(wide, c, 32);
  const Prediction ac = simulate(program("a", 2, "c", 2), wide, c, pw);
  const Prediction a2 = simulate(program("a", 2, "a", 2), wide, c, pw);
  EXPECT_NEAR(ac.step_seconds, a2.step_seconds, 1e-9 * a2.step_seconds);
  // a sub-group of an axis (a hierarchical reduction's piece) counts as its axis in prefetch
  EXPECT_EQ(shard::Mesh::axes_of("a[1:2]"), "a");
  EXPECT_EQ(shard::Mesh::axes_of("x[1:4]+y"), "x+y");
}

TEST(Simulate, AutoBucketsAreNeverPredictedSlowerThanBlock) {
  const std::string slow = std::string(LOOM_SOURCE_DIR) + "/tests/slow-link.toml";
  for (const std::string& file : {std::string(LOOM_SOURCE_DIR) + "/clusters/h100-sxm.toml", slow}) {
    const Cluster c = load_cluster(file);
    for (const PlanCase& pc : plans()) {
      SCOPED_TRACE(file + " " + pc.name);
      auto with = [&](const char* bucket) {
        std::vector<std::string> sets = pc.sets;
        sets.push_back(std::string("passes.bucket=") + bucket);
        sets.push_back("passes.cluster=\"" + file + "\"");
        shard::Mesh mesh;
        const shard::Program prog = program("bench-llama.toml", sets, &mesh);
        return simulate(prog.graph, mesh, c, place(mesh, c, mesh.size()));
      };
      const Prediction block = with("block"), automatic = with("auto");
      EXPECT_LE(automatic.step_seconds, block.step_seconds * (1 + 1e-9));
      EXPECT_GT(automatic.collectives, 0);
      if (std::string(pc.name) == "fsdp") {
        if (file == slow)
          EXPECT_EQ(automatic.collectives, block.collectives);
        else
          EXPECT_LT(automatic.collectives, block.collectives);
      }
    }
  }
}

// A pipeline's stages side by side (simulate_pipeline): with more micro-batches the stages wait
// a smaller part of the step (the bubble, (p - 1) / (m + p - 1) for equal stages), every recv is
// matched by a send, and one stage alone (a stage's program cannot run by itself) is refused.
TEST(Simulate, APipelinesBubbleShrinksWithMoreMicroBatches) {
  Cluster h = shipped("h100-sxm.toml");
  std::vector<double> bubble;
  for (int m : {2, 4, 8}) {
    const train::Config cfg = train::load_config(
        std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml",
        {"plan.mesh={pipe=2}", "train.batch_size=8", "model.n_layers=4",
         fmt::format(R"(plan.tactics=[{{kind="pipeline",axis="pipe",microbatches={}}}])", m)});
    const shard::Mesh& mesh = cfg.plan.plan.mesh;
    const train::CompiledStep s0 = train::compile_step(cfg, passes::StepKind::train, true, 2, 0);
    const train::CompiledStep s1 = train::compile_step(cfg, passes::StepKind::train, true, 2, 1);
    const Placement pl = place(mesh, h, 2);
    const std::vector<Prediction> p =
        simulate_pipeline({&s0.c.rank.graph, &s1.c.rank.graph}, mesh, h, pl);
    ASSERT_EQ(p.size(), 2u);
    double waited = 0;
    for (const Prediction& e : p) {
      EXPECT_GT(e.compute_seconds, 0);
      waited += e.exposed_comm_seconds / e.step_seconds / 2;
    }
    bubble.push_back(waited);
    std::printf("pipeline 2 stages, %d micro-batches: mean wait %.3f of the step (theory %.3f)\n",
                m, waited, 1.0 / (m + 1));
    EXPECT_THROW(simulate(s1.c.rank.graph, mesh, h, pl), Error);
  }
  EXPECT_GT(bubble[0], bubble[1]);
  EXPECT_GT(bubble[1], bubble[2]);
}

// The interleaved schedule's point (Narayanan et al. 2021): with each of p stages holding v model
// chunks, the bubble is (p - 1) / (v m + p - 1) rather than 1F1B's (p - 1) / (m + p - 1). On
// 4 stages and 4 micro-batches of a 6-block model (8 groups: one per chunk at v = 2), the
// simulated wait and step time fall from 1F1B's, and every stage's program ends (no schedule
// waits for a message no stage sends).
TEST(Simulate, InterleavingShrinksTheBubble) {
  Cluster h = shipped("h100-sxm.toml");
  auto run = [&](const char* schedule, int m) {
    const train::Config cfg = train::load_config(
        std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml",
        {"plan.mesh={pipe=4}", "train.batch_size=8", "model.n_layers=6",
         fmt::format(R"(plan.tactics=[{{kind="pipeline",axis="pipe",schedule="{}",)"
                     R"(microbatches={}}}])",
                     schedule, m)});
    const std::vector<Prediction> p = simulate_stages(cfg, h);
    double waited = 0, step = 0;
    for (const Prediction& e : p) {
      waited += e.exposed_comm_seconds / e.step_seconds / 4;
      step = std::max(step, e.step_seconds);
    }
    std::printf("pipeline 4 stages, %d micro-batches, %s: mean wait %.3f, step %.3g s\n", m,
                schedule, waited, step);
    return std::pair{waited, step};
  };
  for (int m : {4, 8}) {
    const auto [w1, s1] = run("1f1b", m);
    const auto [w2, s2] = run("interleaved", m);
    EXPECT_LT(w2, w1) << m << " micro-batches";
    EXPECT_LT(s2, s1) << m << " micro-batches";
  }
}

// Every interleaved schedule the tactic accepts runs to its end: on 2, 3 and 4 stages of 2 and 3
// chunks, with as many micro-batches as stages and twice as many, the stages' programs simulated
// side by side finish (simulate_pipeline stops with an error where every unfinished stage waits
// for a message no stage sends), and every stage computes.
TEST(Simulate, EveryInterleavedScheduleEnds) {
  Cluster h = shipped("h100-sxm.toml");
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p}) {
        SCOPED_TRACE(fmt::format("{} stages, {} chunks each, {} micro-batches", p, v, m));
        const train::Config cfg = train::load_config(
            std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml",
            {fmt::format("plan.mesh={{pipe={}}}", p), fmt::format("train.batch_size={}", m),
             fmt::format("model.n_layers={}", p * v - 2 > 0 ? p * v - 2 : 1),
             fmt::format(R"(plan.tactics=[{{kind="pipeline",axis="pipe",schedule="interleaved",)"
                         R"(microbatches={},virtual_stages={}}}])",
                         m, v)});
        std::vector<Prediction> r;
        ASSERT_NO_THROW(r = simulate_stages(cfg, h));
        for (const Prediction& e : r) EXPECT_GT(e.compute_seconds, 0);
      }
}

}  // namespace
}  // namespace loom::sim
