// Cross-component (shard + runtime + comm): Mesh and Sharding values, the text form, block copies,
// and the reshard property: for random shardings A and B of a random tensor, lowering A -> B -> A
// and running it on local ranks gives back every rank's block of A, and the B stage holds exactly
// B's blocks (seed printed on failure); an axis moving between dims is one all_to_all.
#include <gtest/gtest.h>

#include <mutex>
#include <random>

#include "loom/comm/local.h"
#include "loom/core/error.h"
#include "loom/ir/text.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/executor.h"
#include "loom/shard/lower.h"
#include "loom/shard/sharding.h"

namespace loom::shard {
namespace {

TEST(Mesh, RowMajorCoordinates) {
  Mesh m({{"data", 2}, {"model", 3}});
  EXPECT_EQ(m.size(), 6);
  EXPECT_EQ(m.coord(4, "data"), 1);
  EXPECT_EQ(m.coord(4, "model"), 1);
  EXPECT_EQ(m.coord(5, "model"), 2);
  EXPECT_EQ(m.to_string(), "{data = 2, model = 3}");
  EXPECT_THROW(Mesh({{"data", 2}, {"data", 2}}), Error);
  EXPECT_THROW(Mesh({{"data", 0}}), Error);
  EXPECT_THROW(Mesh(std::vector<std::pair<std::string, int64_t>>{}), Error);
}

TEST(Sharding, TextRoundTrips) {
  for (std::string t :
       {"{data,_,_}", "{model+data,_}", "{_,_|sum=data}", "{}", "{|sum=data+model}"}) {
    Sharding s = parse_sharding(t);
    EXPECT_EQ(to_string(s), t);
  }
  EXPECT_THROW(parse_sharding("data,_"), Error);
  EXPECT_THROW(parse_sharding("{data,,_}"), Error);
  EXPECT_THROW(parse_sharding("{_|data}"), Error);
}

TEST(Sharding, LocalShapeAndChecks) {
  Mesh m({{"data", 2}, {"model", 2}});
  Sharding s = parse_sharding("{model+data,_}");
  EXPECT_EQ(local_shape({8, 6}, s, m), (Shape{2, 6}));
  EXPECT_EQ(block_index(s, m, 0, 1), 2);  // rank 1: data 0, model 1 -> block 1*2 + 0
  EXPECT_EQ(block_index(s, m, 0, 2), 1);  // rank 2: data 1, model 0 -> block 0*2 + 1
  EXPECT_EQ(check_sharding({8, 6}, s, m), "");
  EXPECT_NE(check_sharding({6, 6}, s, m).find("not divisible by 4"), std::string::npos);
  EXPECT_NE(check_sharding({8, 6}, parse_sharding("{data,data}"), m).find("used twice"),
            std::string::npos);
  EXPECT_NE(check_sharding({8, 6}, parse_sharding("{batch,_}"), m).find("not in the mesh"),
            std::string::npos);
  EXPECT_NE(check_sharding({8}, s, m).find("2 dims"), std::string::npos);
}

TEST(Sharding, BlocksTileTheTensor) {
  Mesh m({{"a", 2}, {"b", 3}});
  Shape shape{4, 6, 5};
  Sharding s = parse_sharding("{a,_,_}");
  s.dims[1] = {"b"};
  std::vector<float> g(size_t(numel(shape))), back(g.size(), -1);
  for (size_t i = 0; i < g.size(); ++i) g[i] = float(i);
  for (int64_t r = 0; r < m.size(); ++r) {
    std::vector<float> local(size_t(numel(local_shape(shape, s, m))));
    copy_block(g.data(), local.data(), shape, 4, s, m, r);
    copy_block_back(local.data(), back.data(), shape, 4, s, m, r);
  }
  EXPECT_EQ(back, g);
}

// A random sharding of `shape` on `m`: each axis lands on a dim it divides, or in the partial set.
Sharding random_sharding(std::mt19937& rng, const Shape& shape, const Mesh& m, bool partial) {
  Sharding s = Sharding::replicated(shape.size());
  for (const auto& [axis, n] : m.axes()) {
    int choice = int(rng() % (shape.size() + 2));
    if (choice == int(shape.size()) && partial) {
      s.partial.push_back(axis);
    } else if (choice < int(shape.size())) {
      Sharding t = s;
      t.dims[size_t(choice)].push_back(axis);
      if (check_sharding(shape, t, m).empty()) s = t;
    }
  }
  return s;
}

// Lowers x (kept as a) -> y (kept as b) -> z (kept as a) and runs it on local ranks: returns the
// lowered program's text and every rank whose B blocks or round trip differ.
std::pair<std::string, std::vector<std::string>> round_trip(const Sharding& a, const Sharding& b,
                                                            const Mesh& m, const Shape& shape,
                                                            std::mt19937& rng) {
  ir::Graph g("reshard");
  int x = g.add_input("x", {DType::f32, shape}, ir::ValueKind::input);
  int y = g.add_node(ir::Op::scale, {x}, {{"s", 1.0}}, {{DType::f32, shape}}, {"y"})[0];
  int z = g.add_node(ir::Op::scale, {y}, {{"s", 1.0}}, {{DType::f32, shape}}, {"z"})[0];
  g.add_output(z);
  g.add_output(y);  // an output stays live to the end of the run
  Annotations ann;
  ann[x].sharding = a;
  ann[y].sharding = b;
  ann[z].sharding = a;
  Propagation p = propagate(g, m, ann);
  Program prog = lower(g, m, p);
  std::vector<float> full(size_t(numel(shape)));
  for (auto& v : full) v = float(rng() % 1000) / 8.0f;
  std::mutex mu;
  std::vector<std::string> errors;
  comm::run_local(int(m.size()), [&](comm::Communicator& c) {
    runtime::MeshComms mc(c, m);
    runtime::Executor ex(prog.graph);
    ex.set_comms(&mc);
    std::vector<float> in(size_t(numel(local_shape(shape, a, m))));
    copy_block(full.data(), in.data(), shape, 4, a, m, c.rank());
    ex.bind(prog.local[size_t(x)], in.data());
    ex.run();
    std::vector<float> want_b(size_t(numel(local_shape(shape, b, m))));
    copy_block(full.data(), want_b.data(), shape, 4, b, m, c.rank());
    const float* got_b = ex.ptr<float>(prog.outputs[1]);
    const float* got_a = ex.ptr<float>(prog.outputs[0]);
    std::lock_guard<std::mutex> lock(mu);
    if (!std::equal(want_b.begin(), want_b.end(), got_b))
      errors.push_back("rank " + std::to_string(c.rank()) + ": the B blocks differ");
    if (!std::equal(in.begin(), in.end(), got_a))
      errors.push_back("rank " + std::to_string(c.rank()) + ": A -> B -> A differs");
  });
  return {ir::print(prog.graph), errors};
}

TEST(Reshard, RoundTripRestoresEveryBlock) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  Mesh m({{"data", 2}, {"model", 2}});
  for (int trial = 0; trial < 25; ++trial) {
    Shape shape{4, 8, 6};
    Sharding a = random_sharding(rng, shape, m, false), b = random_sharding(rng, shape, m, false);
    auto [text, errors] = round_trip(a, b, m, shape, rng);
    for (const auto& e : errors)
      ADD_FAILURE() << to_string(a) << " -> " << to_string(b) << ": " << e << "\n" << text;
  }
}

TEST(Reshard, MovingAnAxisBetweenDimsIsOneAllToAll) {
  std::mt19937 rng(7);
  Mesh m({{"data", 2}, {"model", 2}});
  auto [text, errors] = round_trip(parse_sharding("{model,data,_}"),
                                   parse_sharding("{_,data,model}"), m, {4, 8, 6}, rng);
  for (const auto& e : errors) ADD_FAILURE() << e << "\n" << text;
  EXPECT_NE(text.find("all_to_all(%y) {axis = \"model\", concat_dim = 0, n = 2, split_dim = 2}"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("all_gather"), std::string::npos) << text;
}

TEST(Reshard, PartialSumsReduceToTheirTarget) {
  // x (whole) -> matmul with a weight split on the contraction dim gives a partial sum over model;
  // kept whole or split on rows, it must equal the unsplit product.
  Mesh m({{"model", 2}});
  for (std::string target : {"{_,_}", "{model,_}", "{_,model}"}) {
    ir::Graph g("partial");
    int x = g.add_input("x", {DType::f32, {4, 6}}, ir::ValueKind::input);
    int w = g.add_input("w", {DType::f32, {8, 6}}, ir::ValueKind::param);
    int y = g.add_node(ir::Op::matmul, {x, w}, {{"ta", int64_t(0)}, {"tb", int64_t(1)}},
                       {{DType::f32, {4, 8}}}, {"y"})[0];
    int z = g.add_node(ir::Op::scale, {y}, {{"s", 1.0}}, {{DType::f32, {4, 8}}}, {"z"})[0];
    g.add_output(z);
    Annotations ann;
    ann[x].sharding = Sharding::replicated(2);
    ann[w].sharding = parse_sharding("{_,model}");
    ann[z].sharding = parse_sharding(target);
    Propagation p = propagate(g, m, ann);
    EXPECT_EQ(to_string(p.node[size_t(g.value(y).producer)].results[0]), "{_,_|sum=model}");
    Program prog = lower(g, m, p);
    std::vector<float> xs(24), ws(48), want(32, 0);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = float(i % 5) - 2;
    for (size_t i = 0; i < ws.size(); ++i) ws[i] = float(i % 7) - 3;
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 6; ++k)
          want[size_t(r * 8 + c)] += xs[size_t(r * 6 + k)] * ws[size_t(c * 6 + k)];
    std::mutex mu;
    std::vector<std::string> errors;
    comm::run_local(2, [&](comm::Communicator& c) {
      runtime::MeshComms mc(c, m);
      runtime::Executor ex(prog.graph);
      ex.set_comms(&mc);
      std::vector<float> wl(24);
      copy_block(ws.data(), wl.data(), {8, 6}, 4, ann[w].sharding, m, c.rank());
      ex.bind(prog.local[size_t(x)], xs.data());
      ex.bind(prog.local[size_t(w)], wl.data());
      ex.run();
      Sharding t = parse_sharding(target);
      std::vector<float> wb(size_t(numel(local_shape({4, 8}, t, m))));
      copy_block(want.data(), wb.data(), {4, 8}, 4, t, m, c.rank());
      const float* got = ex.ptr<float>(prog.outputs[0]);
      std::lock_guard<std::mutex> lock(mu);
      if (!std::equal(wb.begin(), wb.end(), got))
        errors.push_back(target + ": rank " + std::to_string(c.rank()) + " differs\n" +
                         ir::print(prog.graph));
    });
    for (const auto& e : errors) ADD_FAILURE() << e;
  }
}

}  // namespace
}  // namespace loom::shard
