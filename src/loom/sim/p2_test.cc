// P² synthesis: placements as parallelism matrices, the symbolic run refusing what is not a
// reduction, every synthesized program valid, and the hierarchical all-reduce found and ranked
// above the flat one where an axis spans nodes.
#include "loom/sim/p2.h"

#include <gtest/gtest.h>

#include "loom/core/error.h"

namespace loom::sim::p2 {
namespace {

sim::Cluster h100() {
  return sim::load_cluster(std::string(LOOM_SOURCE_DIR) + "/clusters/h100-sxm.toml");
}

TEST(Placements, AreTheParallelismMatrices) {
  const sim::Cluster c = h100();  // 8 per node
  // {x = 8, y = 4} on 4 nodes: x's share of a node is 8, 4 or 2 (y's 1, 2, 4)
  const auto p = placements({8, 4}, c, 32);
  ASSERT_EQ(p.size(), 3u);
  for (const auto& f : p) {
    int64_t x = 1, y = 1, node = 1;
    for (const Factor& q : f) {
      (q.axis == 0 ? x : y) *= q.size;
      if (q.level == 0) node *= q.size;
    }
    EXPECT_EQ(x, 8);
    EXPECT_EQ(y, 4);
    EXPECT_EQ(node, 8);
  }
  EXPECT_EQ(placements({2, 4}, c, 8).size(), 1u);  // one node: everything on NVLink
  EXPECT_THROW(placements({8, 4}, c, 16), Error);
}

// x = 2 in a node times 4 across nodes (factor 0 on nvlink, factor 1 on ib)
const std::vector<Factor> kSpread{{0, 0, 2}, {0, 1, 4}};

// Every program of up to `steps` steps over the groups of `reduce` (all five collectives).
std::vector<Program> every_program(uint32_t reduce, int steps) {
  std::vector<uint32_t> groups;
  for (uint32_t g = reduce; g; g = (g - 1) & reduce) groups.push_back(g);
  std::vector<Program> out{{}};
  for (size_t begin = 0, k = 0; k < size_t(steps); ++k) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i)
      for (uint32_t g : groups)
        for (Coll op : {Coll::all_reduce, Coll::reduce_scatter, Coll::reduce, Coll::all_gather,
                        Coll::broadcast}) {
          Program p = out[i];
          p.steps.push_back({op, g});
          out.push_back(std::move(p));
        }
    begin = end;
  }
  return out;
}

// valid() checks a reduction of more than 64 ranks on its factors at size 2: which programs are
// valid must not depend on the factors' sizes. Checked exhaustively on small reductions, each run
// at its own sizes (all within 64 ranks): two factors up to 4 steps, three up to 3.
TEST(Valid, DependsOnTheFactorsNotTheirSizes) {
  struct Case {
    std::vector<Factor> small, other;
    uint32_t reduce;
    int steps;
  };
  const std::vector<Case> cases{
      {{{0, 0, 2}, {0, 1, 2}}, {{0, 0, 3}, {0, 1, 4}}, 3, 4},
      {{{0, 0, 2}, {1, 0, 2}, {0, 1, 2}}, {{0, 0, 2}, {1, 0, 3}, {0, 1, 4}}, 7, 3},
      {{{0, 0, 2}, {1, 0, 2}, {0, 1, 2}}, {{0, 0, 4}, {1, 0, 2}, {0, 1, 3}}, 5, 4}};
  for (const Case& c : cases) {
    int accepted = 0, checked = 0;
    for (const Program& p : every_program(c.reduce, c.steps)) {
      if (p.steps.empty()) continue;
      const bool a = valid(p, c.small, c.reduce), b = valid(p, c.other, c.reduce);
      EXPECT_EQ(a, b) << p.text(c.other, {"x", "y"});
      accepted += a;
      ++checked;
    }
    EXPECT_GT(accepted, 2) << "of " << checked;  // the flat, hierarchical and rooted ones at least
  }
}

// A reduction of more than 64 ranks (fsdp over 32 nodes of 8) is synthesized and checked on its
// shape, and one of more than six factors gets the flat all_reduce alone (the one program valid()
// accepts there); neither aborts.
TEST(Synthesize, ReductionsOfMoreThan64Ranks) {
  const sim::Cluster c = h100();
  const std::vector<Factor> wide{{0, 0, 8}, {0, 1, 32}};  // x = 256: 8 in a node, 32 nodes
  const auto progs = synthesize(wide, 3, 256e6, c, 5, false);
  ASSERT_FALSE(progs.empty());
  EXPECT_LT(progs[0].seconds, flat_seconds(wide, 3, 256e6, c));  // hierarchical wins across nodes
  EXPECT_TRUE(valid(progs[0], wide, 3));
  std::string why;
  EXPECT_FALSE(valid({{{Coll::all_reduce, 3}, {Coll::all_reduce, 1}}}, wide, 3, &why));
  EXPECT_EQ(why, "an input summed twice");
  std::vector<Factor> seven;
  for (int i = 0; i < 7; ++i) seven.push_back({i, i < 3 ? 0 : 1, 2});
  const auto flat = synthesize(seven, 127, 1e6, c, 5, false);
  ASSERT_EQ(flat.size(), 1u);
  ASSERT_EQ(flat[0].steps.size(), 1u);
  EXPECT_EQ(flat[0].steps[0].op, Coll::all_reduce);
  EXPECT_TRUE(valid(flat[0], seven, 127));
  EXPECT_FALSE(valid({{{Coll::reduce_scatter, 1}, {Coll::all_reduce, 126}, {Coll::all_gather, 1}}},
                     seven, 127, &why));
  EXPECT_EQ(why, "a reduction over more than 6 factors: only the flat all_reduce");
}

TEST(Valid, AcceptsReductionsAndRefusesWhatIsNotOne) {
  const Program flat{{{Coll::all_reduce, 3}}};
  const Program hier{{{Coll::reduce_scatter, 1}, {Coll::all_reduce, 2}, {Coll::all_gather, 1}}};
  const Program rooted{{{Coll::reduce, 1}, {Coll::all_reduce, 2}, {Coll::broadcast, 1}}};
  const Program two{{{Coll::reduce_scatter, 2},
                     {Coll::reduce_scatter, 1},
                     {Coll::all_gather, 1},
                     {Coll::all_gather, 2}}};
  for (const Program* p : {&flat, &hier, &rooted, &two}) {
    std::string why;
    EXPECT_TRUE(valid(*p, kSpread, 3, &why)) << p->text(kSpread, {"x"}) << ": " << why;
  }
  std::string why;
  // summing one input twice
  EXPECT_FALSE(valid({{{Coll::all_reduce, 3}, {Coll::all_reduce, 1}}}, kSpread, 3, &why));
  EXPECT_EQ(why, "an input summed twice");
  // an all_reduce over ranks holding different pieces
  EXPECT_FALSE(valid({{{Coll::reduce_scatter, 1}, {Coll::all_reduce, 1}, {Coll::all_gather, 1}}},
                     kSpread, 3, &why));
  // gathering in the wrong order leaves the pieces permuted
  EXPECT_FALSE(valid({{{Coll::reduce_scatter, 2},
                       {Coll::reduce_scatter, 1},
                       {Coll::all_gather, 2},
                       {Coll::all_gather, 1}}},
                     kSpread, 3, &why));
  EXPECT_EQ(why, "pieces gathered out of their order");
  // not reduced over every factor
  EXPECT_FALSE(valid({{{Coll::all_reduce, 1}}}, kSpread, 3, &why));
  // a root that never broadcasts
  EXPECT_FALSE(valid({{{Coll::reduce, 3}}}, kSpread, 3, &why));
}

TEST(Synthesize, EveryProgramIsValidAndTheHierarchicalOneWinsAcrossNodes) {
  const sim::Cluster c = h100();
  const double bytes = 256e6;
  const auto programs = synthesize(kSpread, 3, bytes, c);
  ASSERT_GT(programs.size(), 3u);
  bool has_flat = false;
  for (const Program& p : programs) {
    EXPECT_TRUE(valid(p, kSpread, 3)) << p.text(kSpread, {"x"});
    EXPECT_DOUBLE_EQ(p.seconds, seconds(p, kSpread, bytes, c));
    has_flat |= p.steps.size() == 1 && p.steps[0].op == Coll::all_reduce;
  }
  EXPECT_TRUE(has_flat);
  const Program& best = programs.front();
  EXPECT_LT(best.seconds, flat_seconds(kSpread, 3, bytes, c));
  // reduce_scatter in the node, all_reduce across nodes on the piece, all_gather in the node
  ASSERT_EQ(best.steps.size(), 3u) << best.text(kSpread, {"x"});
  EXPECT_EQ(best.steps[0].op, Coll::reduce_scatter);
  EXPECT_EQ(best.steps[0].group, 1u);
  EXPECT_EQ(best.steps[1].op, Coll::all_reduce);
  EXPECT_EQ(best.steps[1].group, 2u);
  EXPECT_EQ(best.steps[2].op, Coll::all_gather);
  // within one node nothing beats the flat all_reduce
  const std::vector<Factor> node{{0, 0, 8}};
  EXPECT_DOUBLE_EQ(synthesize(node, 1, bytes, c).front().seconds, flat_seconds(node, 1, bytes, c));
}

// Two hosts of two ranks with one link each (clusters/two-hosts.toml): the flat ring over the
// four ranks crosses the link once each way, 1.5 buffers; reduce_scatter in the host, all_reduce
// across, all_gather sends 1 buffer a host, but its two groups cross at once on one link. The
// synthesized program still wins, by at most the 1.5x of the bytes (not the 3x of one link each).
TEST(Synthesize, GroupsThatCrossAtOnceShareTheHostsLink) {
  const sim::Cluster c =
      sim::load_cluster(std::string(LOOM_SOURCE_DIR) + "/clusters/two-hosts.toml");
  const std::vector<Factor> f{{0, 0, 2, 1}, {0, 1, 2, 2}};
  const double bytes = 64e6;
  const auto programs = synthesize(f, 3, bytes, c, 5, false);
  const Program& best = programs.front();
  const double flat = flat_seconds(f, 3, bytes, c);
  EXPECT_NEAR(flat, 1.5 * bytes / c.levels[1].bandwidth, 0.01 * flat);
  EXPECT_EQ(best.text(f, {"x"}),
            "reduce_scatter(x:2@L0) ; all_reduce(x:2@L1) ; all_gather(x:2@L0)");
  EXPECT_GT(flat / best.seconds, 1.2);
  EXPECT_LT(flat / best.seconds, 1.5);
  // with a link per device the same program would look 3x as fast across
  sim::Cluster own = c;
  own.levels[1].shared_by = 1;
  EXPECT_GT(flat_seconds(f, 3, bytes, own) / synthesize(f, 3, bytes, own, 5, false).front().seconds,
            2.0);
}

}  // namespace
}  // namespace loom::sim::p2
