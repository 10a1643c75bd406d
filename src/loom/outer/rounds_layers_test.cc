// The outer server's rounds over a model with layers: streaming DiLoCo's fragments, each with
// rounds of its own, and DiPaCo's module table, each module averaged over the paths through it.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/outer/fragments.h"
#include "loom/outer/rounds.h"
#include "loom/outer/testing.h"

namespace loom::outer {
namespace {

using Time = Rounds::Time;

using namespace test;

// Streaming DiLoCo: each fragment has rounds, a version and expected members of its own; a round
// moves its fragment's parameters and momentum only; the state keeps every fragment's version.
TEST(Rounds, EachFragmentHasItsOwnRounds) {
  const TensorList init = layered(1);
  Rounds r({.opt = {0.5, 0.5}, .fragments = 2}, init);
  ASSERT_EQ(r.fragments(), 2u);
  // layer 0 -> fragment 0, layer 1 -> fragment 1; the head (5) to the lighter fragment 1 (4 < 12)
  EXPECT_EQ(r.fragment_tensors(0), std::vector<size_t>({0}));
  EXPECT_EQ(r.fragment_tensors(1), std::vector<size_t>({1, 2}));
  const Time t{};
  Rounds::Joined ja, jb;
  ASSERT_FALSE(r.join("a", init, t, &ja));
  ASSERT_FALSE(r.join("b", init, t, &jb));
  const uint64_t a = ja.island_id, b = jb.island_id;
  Rounds::Pushed p;
  auto push = [&](uint64_t id, uint32_t f, uint64_t base, const TensorList& g) {
    return r.push({id, base, 5, 0.5, f}, gather(g, r.fragment_tensors(f)), t, &p);
  };
  const TensorList g1 = layered(2), g2 = layered(3);
  ASSERT_FALSE(push(a, 0, 0, g1));
  ASSERT_FALSE(push(a, 1, 0, g1));  // a pushes both before b pushes either
  EXPECT_EQ(r.version(), 0u);
  EXPECT_EQ(r.round_state(a, 1, 0), RoundState::pending);
  EXPECT_EQ(r.round_state(b, 0, 0), RoundState::resend);
  ASSERT_FALSE(push(b, 0, 0, g2));  // closes fragment 0's round only
  EXPECT_EQ(p.version, 1u);
  EXPECT_EQ(r.version(0), 1u);
  EXPECT_EQ(r.version(1), 0u);
  EXPECT_EQ(r.version(), 1u);
  EXPECT_EQ(r.round_state(a, 0, 0), RoundState::closed);
  EXPECT_EQ(r.round_state(a, 1, 0), RoundState::pending);
  // fragment 0 moved by the Nesterov step on the mean, fragment 1 not at all
  TensorList want = init, m = zeros_like(init);
  const TensorList mean01 = mean(g1, g2);
  nesterov_step({0.5, 0.5}, want, m, mean01);
  expect_same(gather(*r.params(), {0}), gather(want, {0}), 1e-6f);
  expect_same(gather(*r.params(), {1, 2}), gather(init, {1, 2}));
  expect_same(gather(r.momentum(), {1, 2}), zeros_like(gather(init, {1, 2})));
  // a push of fragment 0 from its old version is stale; of fragment 1 from a future one invalid
  expect_refused(push(b, 0, 0, g2), RefusalKind::stale,
                 "stale push: made from version 0 of fragment 0, the server is at 1: pull and go "
                 "on");
  expect_refused(push(b, 1, 1, g2), RefusalKind::invalid);
  expect_refused(r.check_header({a, 0, 5, 0.5, 2}), RefusalKind::invalid,
                 "push header: fragment 2, but the server's model has 2");
  // an island joining now is expected in fragment 1's open round, as every island is in a first
  // round, and in fragment 0's next one
  Rounds::Joined jc;
  ASSERT_FALSE(r.join("c", init, t, &jc));
  ASSERT_FALSE(push(b, 1, 0, g2));
  EXPECT_EQ(r.version(1), 0u);
  ASSERT_FALSE(push(jc.island_id, 1, 0, g2));
  EXPECT_EQ(r.version(1), 1u);
  ASSERT_FALSE(push(a, 0, 1, g1));
  ASSERT_FALSE(push(b, 0, 1, g1));
  EXPECT_EQ(r.version(0), 1u) << "c joined before fragment 0's round 2 opened: it is expected";
  ASSERT_FALSE(push(jc.island_id, 0, 1, g1));
  EXPECT_EQ(r.version(0), 2u);
  // the state keeps each fragment's version and each member's first round per fragment
  const StateMeta meta = r.meta();
  EXPECT_EQ(meta.version, 3u);
  EXPECT_EQ(meta.fragment_versions, std::vector<uint64_t>({2, 1}));
  EXPECT_EQ(meta.members.at(jc.island_id).joined, std::vector<uint64_t>({1, 0}));
  Rounds g({.opt = {0.5, 0.5}, .fragments = 2}, init);
  g.resume({meta, *r.params(), r.momentum(), r.buffer()}, t);
  EXPECT_EQ(g.version(0), 2u);
  EXPECT_EQ(g.version(1), 1u);
}

// A model of two blocks and a head, its values those of `seed`, every value of a pseudo-gradient c.
TensorList filled(const TensorList& spec, float c) {
  TensorList t = zeros_like(spec);
  for (auto& x : t)
    for (float& v : x.data) v = c;
  return t;
}

// DiPaCo: every island pushes its path; each module's outer gradient is the mean over the paths
// through it that pushed; a module no push carried keeps its parameters and momentum; a member
// pulls its path; the state keeps each member's path.
TEST(Rounds, DiPaCoAveragesEachModuleOverThePathsThroughIt) {
  const TensorList init = layered(1);  // layers.0 (level 0), layers.1 and the head (level 1)
  const OuterOptConfig opt{1.0, 0.0};  // p - mean
  Rounds r({.opt = opt, .modules = {2, 2}}, init);
  ASSERT_EQ(r.paths().count(), 4u);
  ASSERT_EQ(r.spec().size(), 2 * 1 + 2 * 2u);  // the module table
  const Time t{};
  // a join with the table's names, or a path that does not exist, is refused
  Rounds::Joined j;
  expect_refused(r.join("x", r.spec(), t, &j), RefusalKind::other_model);
  expect_refused(r.join("x", init, t, &j, "", 4), RefusalKind::invalid,
                 "the island trains path 4, but the server's model has 4 path(s)");
  // islands on paths 0 (0.0), 1 (0.1), 3 (1.1); none on 2 (1.0)
  std::vector<uint64_t> id;
  for (uint32_t p : {0u, 1u, 3u}) {
    ASSERT_FALSE(r.join("p" + std::to_string(p), init, t, &j, "", p));
    id.push_back(j.island_id);
  }
  EXPECT_EQ(r.path_of(id[2]), 3u);
  Rounds::Pushed out;
  const float g[] = {1, 2, 4};  // each island's pseudo-gradient, every value
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_FALSE(r.push({id[i], 0, 5, 0.5}, filled(init, g[i]), t, &out));
    EXPECT_EQ(r.version(), i == 2 ? 1u : 0u);
  }
  // level 0: module 0 on paths 0, 1 (mean 1.5), module 1 on path 3 (4); level 1: module 0 on
  // path 0 (1), module 1 on paths 1, 3 (3)
  const std::vector<std::pair<size_t, float>> moved{{0, 1.5f}, {1, 4.f}};
  auto view = [&](uint32_t p) { return r.pulled(*r.params(), 0, p); };
  for (uint32_t p = 0; p < 4; ++p) {
    const TensorList v = view(p);
    const std::vector<int64_t> d = r.paths().digits(p);
    const float want[] = {d[0] == 0 ? 1.5f : 4.f, d[1] == 0 ? 1.f : 3.f};
    ASSERT_EQ(v.size(), init.size());
    for (size_t k = 0; k < init.size(); ++k) {
      EXPECT_EQ(v[k].name, init[k].name);
      const float step = want[k == 0 ? 0 : 1];
      for (size_t i = 0; i < init[k].data.size(); ++i)
        EXPECT_FLOAT_EQ(v[k].data[i], init[k].data[i] - step) << "path " << p << " " << v[k].name;
    }
  }
  // with momentum, a round in which only paths 0 and 1 push leaves level 0's module 1 (on paths 2
  // and 3 only) as it was: its parameters, and its momentum at zero
  Rounds r2({.opt = {0.5, 0.5}, .modules = {2, 2}}, init);
  std::vector<uint64_t> id2;
  for (uint32_t p : {0u, 1u}) {
    ASSERT_FALSE(r2.join("p", init, t, &j, "", p));
    id2.push_back(j.island_id);
  }
  for (size_t i = 0; i < 2; ++i)
    ASSERT_FALSE(r2.push({id2[i], 0, 5, 0.5}, filled(init, 1), t, &out));
  EXPECT_EQ(r2.version(), 1u);
  const TensorList v2 = r2.pulled(*r2.params(), 0, 2);  // module 1 at level 0: no push carried it
  expect_same(gather(v2, {0}), gather(init, {0}));
  // the table: l0m0 (index 0), l0m1 (1), then level 1's modules
  for (float x : r2.momentum()[1].data) EXPECT_EQ(x, 0.f) << "an untouched module's momentum";
  for (float x : r2.momentum()[0].data) EXPECT_NE(x, 0.f);
  // the state keeps each member's path; a restored server checks it
  const StateMeta meta = r.meta();
  EXPECT_EQ(meta.members.at(id[2]).path, 3u);
  Rounds back({.opt = opt, .modules = {2, 2}}, init);
  back.resume({meta, *r.params(), r.momentum(), r.buffer()}, t);
  EXPECT_EQ(back.path_of(id[2]), 3u);
  StateMeta bad = meta;
  bad.members.at(id[2]).path = 4;
  Rounds other({.opt = opt, .modules = {2, 2}}, init);
  EXPECT_THROW(other.resume({bad, *r.params(), r.momentum(), r.buffer()}, t), Error);
}

TEST(Rounds, DiPaCoNeedsSyncRoundsOfOneFragmentAndF32Pulls) {
  const TensorList init = layered(1);
  EXPECT_THROW({ Rounds r({.mode = OuterMode::async, .modules = {2}}, init); }, Error);
  EXPECT_THROW({ Rounds r({.fragments = 2, .modules = {2}}, init); }, Error);
  EXPECT_THROW({ Rounds r({.modules = {2}, .update_encoding = proto::INT4}, init); }, Error);
  EXPECT_THROW({ Rounds r({.modules = {2, 2, 2}}, init); }, Error);  // 3 levels, 2 blocks
}

}  // namespace
}  // namespace loom::outer
