// The outer server's rounds without a network or a clock: membership, leases (time is an argument),
// sync rounds and their refusals, joining mid-round, the start barrier, async Delayed Nesterov and
// H scaling, and resuming a saved state.
#include "loom/outer/rounds.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "loom/core/error.h"
#include "loom/outer/testing.h"

namespace loom::outer {
namespace {

using std::chrono::milliseconds;
using Time = Rounds::Time;

using test::expect_refused;
using test::expect_same;
using test::layered;
using test::mean;
using test::model;

// A Rounds at time t0 = 0 (a clock of its own), counting the versions its hook saw.
struct Fixture {
  RoundsConfig cfg;
  TensorList init = model(1);
  Time t0{};
  int saved = 0;
  std::vector<std::string> lines;
  Rounds rounds;

  explicit Fixture(RoundsConfig c = {})
      : cfg(c),
        rounds(c, init,
               {[this](const std::string& s) { lines.push_back(s); }, [this] { ++saved; }}) {}

  Time at(int64_t ms) const { return t0 + milliseconds(ms); }
  // The members, and the version, once the leases and the start barrier are checked at `ms`.
  size_t members_at(int64_t ms) {
    rounds.expire(at(ms));
    return rounds.members();
  }
  uint64_t version_at(int64_t ms) {
    rounds.expire(at(ms));
    return rounds.version();
  }
  uint64_t join(int64_t ms = 0, const std::string& name = "island", const std::string& key = "") {
    Rounds::Joined j;
    auto r = rounds.join(name, init, at(ms), &j, key);
    EXPECT_FALSE(r) << r->message;
    return j.island_id;
  }
  std::pair<uint64_t, uint64_t> join_two() {
    const uint64_t a = join();
    return {a, join()};
  }
  std::optional<Refusal> push(uint64_t id, uint64_t base, const TensorList& g, int64_t ms = 0,
                              Rounds::Pushed* out = nullptr, uint32_t steps = 5,
                              double seconds = 0.5) {
    Rounds::Pushed p;
    return rounds.push({id, base, steps, seconds}, g, at(ms), out ? out : &p);
  }
};

TEST(Rounds, ASyncRoundClosesWhenEveryMemberPushedWithTheNesterovStepOnTheMean) {
  Fixture f;
  auto [a, b] = f.join_two();
  EXPECT_NE(a, b);
  EXPECT_EQ(f.rounds.members(), 2u);
  Rounds::Pushed p;
  ASSERT_FALSE(f.push(a, 0, model(2), 10, &p));
  EXPECT_EQ(p.version, 0u);  // b is awaited
  EXPECT_EQ(f.rounds.round_state(a, 0, 0), RoundState::pending);
  EXPECT_EQ(f.rounds.round_state(b, 0, 0), RoundState::resend);  // b holds no push here
  EXPECT_EQ(f.saved, 0);
  ASSERT_FALSE(f.push(b, 0, model(3), 20, &p));
  EXPECT_EQ(p.version, 1u);
  EXPECT_EQ(p.inner_steps, 50u);  // sync: H as configured
  EXPECT_EQ(f.saved, 1);          // the hook saw version 1 before the push returned
  EXPECT_EQ(f.rounds.round_state(a, 0, 0), RoundState::closed);
  EXPECT_EQ(f.rounds.pushes(), 2);

  TensorList want = f.init, m = zeros_like(f.init);
  nesterov_step(f.cfg.opt, want, m, mean(model(2), model(3)));
  expect_same(*f.rounds.params(), want, 1e-6f);
  expect_same(f.rounds.momentum(), m, 1e-6f);
  EXPECT_EQ(f.lines.back(), "round 1 closed: 2 island(s) pushed, 2 member(s)");
}

TEST(Rounds, AMemberWhoseLeaseExpiredIsDroppedAndNotWaitedFor) {
  Fixture f({.lease_s = 1});
  auto [a, b] = f.join_two();                 // leases to 1000 ms
  ASSERT_FALSE(f.push(b, 0, model(2), 600));  // b's to 1600 ms
  EXPECT_EQ(f.version_at(900), 0u);
  EXPECT_EQ(f.rounds.members(), 2u);
  EXPECT_EQ(f.version_at(1001), 1u);  // closed without a
  EXPECT_EQ(f.rounds.members(), 1u);
  EXPECT_EQ(f.saved, 1);
  EXPECT_EQ(f.lines[2], fmt::format("island {} (island) pushed to round 1", b));
  EXPECT_EQ(f.lines[3], fmt::format("island {} (island) dropped: lease expired", a));
  // a learns it must join again
  expect_refused(f.rounds.touch(a, f.at(1002)), RefusalKind::not_member,
                 fmt::format("island {} is not a member (its lease expired, or it never joined): "
                             "join again",
                             a));
  // a call renews the lease: b, touched at 1002, lives to 2002
  EXPECT_FALSE(f.rounds.touch(b, f.at(1002)));
  EXPECT_EQ(f.members_at(2000), 1u);
  EXPECT_EQ(f.members_at(2002), 1u);
  EXPECT_EQ(f.members_at(2003), 0u);
}

TEST(Rounds, StaleFutureDuplicateAndUnknownPushesAreRefusedAndChangeNothing) {
  Fixture f;
  auto [a, b] = f.join_two();
  ASSERT_FALSE(f.push(a, 0, model(2)));
  ASSERT_FALSE(f.push(b, 0, model(3)));
  ASSERT_FALSE(f.push(a, 1, model(4)));  // held for round 2
  const TensorList before = *f.rounds.params();
  const int64_t pushes = f.rounds.pushes();

  expect_refused(f.push(b, 0, model(5)), RefusalKind::stale,
                 "stale push: made from version 0, the server is at 1: pull and go on");
  expect_refused(f.push(b, 7, model(5)), RefusalKind::invalid,
                 "push for version 7, but the server is at 1");
  expect_refused(f.push(a, 1, model(5)), RefusalKind::duplicate,
                 fmt::format("island {} already pushed in round 2", a));
  expect_refused(f.push(12345, 1, model(5)), RefusalKind::not_member);
  expect_refused(f.rounds.check_header({a, 1, 0, 0.5}), RefusalKind::invalid,
                 "push header: inner_steps 0 and seconds 0.5 must be positive");
  expect_refused(f.rounds.check_header({a, 1, 3, -1}), RefusalKind::invalid);
  EXPECT_FALSE(f.rounds.check_header({a, 1, 3, 0.5}));

  EXPECT_EQ(f.rounds.version(), 1u);
  EXPECT_EQ(f.rounds.pushes(), pushes);
  expect_same(*f.rounds.params(), before);
  // the round goes on as if nothing happened, with a's push of model(4) in it
  ASSERT_FALSE(f.push(b, 1, model(6)));
  EXPECT_EQ(f.rounds.version(), 2u);
  TensorList want = f.init, m = zeros_like(f.init);
  nesterov_step(f.cfg.opt, want, m, mean(model(2), model(3)));
  nesterov_step(f.cfg.opt, want, m, mean(model(4), model(6)));
  expect_same(*f.rounds.params(), want, 1e-6f);
}

// The server never commits a non-finite parameter: a non-finite pseudo-gradient, finite ones whose
// sum overflows f32 (3e38 + 3e38), and (async) an update that would overflow (lr 1000 on 1e36) are
// each refused naming the tensor and index, and change nothing.
TEST(Rounds, NonFinitePushesAndOverflowingSumsAreRefusedAndChangeNothing) {
  for (OuterMode mode : {OuterMode::sync, OuterMode::async}) {
    SCOPED_TRACE(outer_mode_name(mode));
    Fixture f({.mode = mode, .opt = {.lr = 1000, .momentum = 0.9}});
    auto [a, b] = f.join_two();
    const TensorList before = *f.rounds.params();
    TensorList nan = model(2), big = model(2);
    nan[0].data[3] = std::numeric_limits<float>::quiet_NaN();
    for (float& x : big[0].data) x = mode == OuterMode::sync ? 3e38f : 1e36f;
    auto r = f.push(a, 0, nan);
    expect_refused(r, RefusalKind::invalid);
    EXPECT_NE(r->message.find(fmt::format("tensor '{}' index 3", nan[0].name)), std::string::npos)
        << r->message;
    if (mode == OuterMode::sync) {
      ASSERT_FALSE(f.push(a, 0, big));
      r = f.push(b, 0, big);  // 3e38 + 3e38 = inf in f32
      expect_refused(r, RefusalKind::invalid);
      EXPECT_NE(r->message.find("would overflow"), std::string::npos) << r->message;
    } else {
      r = f.push(a, 0, big);  // p - 1000 (1e36 + 0.9 m): -1.9e39, past f32
      expect_refused(r, RefusalKind::invalid);
      EXPECT_NE(r->message.find("non-finite parameter or momentum"), std::string::npos)
          << r->message;
    }
    EXPECT_EQ(f.rounds.version(), 0u);
    EXPECT_EQ(f.rounds.pushes(), mode == OuterMode::sync ? 1 : 0);
    expect_same(*f.rounds.params(), before);
    for (const auto& t : f.rounds.momentum())
      for (float x : t.data) EXPECT_EQ(x, 0.f);
  }
}

TEST(Rounds, AJoinWithAnotherModelIsRefusedNamingTheTensor) {
  Fixture f;
  TensorList other = f.init;
  other[1].shape = {6};
  Rounds::Joined j;
  expect_refused(f.rounds.join("other", other, f.at(0), &j), RefusalKind::other_model,
                 "the island's model differs from the server's: tensor 1 is 'b' [6] there, "
                 "'b' [5] here");
  other.pop_back();
  expect_refused(f.rounds.join("other", other, f.at(0), &j), RefusalKind::other_model,
                 "the island's model has 1 tensors, the server's 2");
  EXPECT_EQ(f.rounds.members(), 0u);
}

TEST(Rounds, AnIslandJoiningMidRoundIsExpectedFromTheNextRound) {
  Fixture f;
  auto [a, b] = f.join_two();
  ASSERT_FALSE(f.push(a, 0, model(2)));
  ASSERT_FALSE(f.push(b, 0, model(3)));
  ASSERT_FALSE(f.push(a, 1, model(2)));  // round 2 under way
  Rounds::Joined j;
  ASSERT_FALSE(f.rounds.join("late", f.init, f.at(0), &j));
  const uint64_t c = j.island_id;
  EXPECT_EQ(j.version, 1u);
  ASSERT_FALSE(f.push(b, 1, model(3)));
  EXPECT_EQ(f.rounds.version(), 2u);  // closed without c
  ASSERT_FALSE(f.push(a, 2, model(4)));
  ASSERT_FALSE(f.push(b, 2, model(5)));
  EXPECT_EQ(f.rounds.version(), 2u);  // now c is expected
  expect_refused(f.push(c, 1, model(6)), RefusalKind::stale);
  ASSERT_FALSE(f.push(c, 2, model(6)));
  EXPECT_EQ(f.rounds.version(), 3u);
}

// min_islands = 3 with a grace of 400 ms: two islands push at 100 and 200 ms, so the grace runs to
// 500 ms. A third that joins and pushes before then closes the round; without it, the grace does.
TEST(Rounds, TheFirstRoundWaitsForMinIslandsOrItsGrace) {
  for (bool third : {true, false}) {
    Fixture f({.lease_s = 100, .min_islands = 3, .start_grace_s = 0.4});
    auto [a, b] = f.join_two();
    ASSERT_FALSE(f.push(a, 0, model(2), 100));
    ASSERT_FALSE(f.push(b, 0, model(3), 200));
    EXPECT_EQ(f.rounds.version(), 0u);  // two of three
    if (third) {
      uint64_t late = f.join(300);  // still expected in round 1
      EXPECT_EQ(f.version_at(450), 0u);
      ASSERT_FALSE(f.push(late, 0, model(4), 460));
      EXPECT_EQ(f.rounds.version(), 1u);
    } else {
      EXPECT_EQ(f.version_at(499), 0u);
      EXPECT_EQ(f.version_at(500), 1u);
    }
  }
}

// An island kept waiting is told for whom: the members that hold no push of the round, and the
// start barrier's missing islands with the time it has left.
TEST(Rounds, AnOpenRoundSaysWhomItAwaits) {
  Fixture f({.lease_s = 100, .min_islands = 3, .start_grace_s = 0.4});
  const uint64_t a = f.join(0, "fast"), b = f.join(0, "stuck");
  EXPECT_EQ(f.rounds.awaited(0, f.at(0)), "");  // nobody pushed: no round is open
  ASSERT_FALSE(f.push(a, 0, model(2), 100));
  EXPECT_EQ(f.rounds.awaited(0, f.at(200)),
            fmt::format("island {} (stuck); and 2 more of the 3 islands expected ([outer] "
                        "islands; the first round closes without them in 0.3 s)",
                        b));
  EXPECT_EQ(f.version_at(600), 0u);  // the barrier is over, b still holds its lease
  EXPECT_EQ(f.rounds.awaited(0, f.at(600)), fmt::format("island {} (stuck)", b));
  ASSERT_FALSE(f.push(b, 0, model(3), 700));
  EXPECT_EQ(f.rounds.version(), 1u);
  EXPECT_EQ(f.rounds.awaited(0, f.at(700)), "");
  Fixture async({.mode = OuterMode::async});
  const uint64_t c = async.join();
  ASSERT_FALSE(async.push(c, 0, model(2)));
  EXPECT_EQ(async.rounds.awaited(0, async.at(0)), "");  // async waits for nobody
}

TEST(Rounds, AMemberThatLeavesIsNotWaitedFor) {
  Fixture f;
  const uint64_t a = f.join(0, "stays"), b = f.join(0, "goes");
  ASSERT_FALSE(f.push(a, 0, model(2)));
  ASSERT_FALSE(f.rounds.leave(b, f.at(0)));
  EXPECT_EQ(f.lines[2], fmt::format("island {} (stays) pushed to round 1", a));
  EXPECT_EQ(f.lines[3], fmt::format("island {} (goes) left", b));
  EXPECT_EQ(f.rounds.version(), 1u);  // the leave closed the round
  EXPECT_EQ(f.rounds.members(), 1u);
  expect_refused(f.rounds.leave(b, f.at(0)), RefusalKind::not_member);
}

// Two islands, the second three times slower (0.1 and 0.3 s per step), H = 12, Delayed Nesterov
// with N = 2 and a budget of 72 inner steps: each push moves the version at once; an island's speed
// is known from its third push (its first round holds the warm-up, and one round is noise), from
// which the slow island is told to take 4 steps (a beat of 12 x 0.1 s at 0.3 s a step); the sixth
// push spends the budget.
TEST(Rounds, AsyncAppliesEachPushAtOnceAndGivesSlowIslandsFewerSteps) {
  const RoundsConfig c{.mode = OuterMode::async, .inner_steps = 12, .delay = 2, .step_budget = 72};
  Fixture f(c);
  const uint64_t ids[2] = {f.join(), f.join()};
  struct Step {
    int island;
    uint64_t base;
    double seconds;
    uint32_t next_h;
    bool done;
  };
  const Step steps[] = {{0, 0, 1.2, 12, false},  // a first push: no speed yet
                        {1, 0, 3.6, 12, false},  // stale by one: applied anyway
                        {0, 1, 1.2, 12, false},  // one round counted: no speed yet
                        {1, 2, 3.6, 12, false},
                        {0, 3, 1.2, 12, false},  // 0.1 s a step: the fastest
                        {1, 4, 3.6, 4, true}};   // 0.3 s a step; 72 inner steps pushed
  TensorList want = f.init, m = zeros_like(want), buf = zeros_like(want);
  int64_t count = 0;
  for (size_t k = 0; k < std::size(steps); ++k) {
    const Step& s = steps[k];
    Rounds::Pushed p;
    ASSERT_FALSE(f.push(ids[s.island], s.base, model(2 + k), 0, &p, 12, s.seconds)) << k;
    delayed_nesterov_push(c.opt, 2, want, m, buf, count, model(2 + k));
    EXPECT_EQ(p.version, k + 1) << k;
    EXPECT_EQ(f.saved, int(k + 1)) << k;
    EXPECT_EQ(p.inner_steps, s.next_h) << k;
    EXPECT_EQ(p.done, s.done) << k;
    // N = 2: two pushes a period; the second closes it
    EXPECT_EQ(p.period, k / 2 + 1) << k;
    EXPECT_EQ(f.rounds.periods(), (k + 1) / 2) << k;
    EXPECT_EQ(f.rounds.round_state(ids[s.island], 0, p.version), RoundState::pending) << k;
    expect_same(*f.rounds.params(), want, 1e-6f);
  }
  expect_refused(f.push(ids[0], 9, model(9)), RefusalKind::invalid);  // from the future
  EXPECT_TRUE(f.rounds.done());
  expect_same(f.rounds.momentum(), m, 1e-6f);
  expect_same(f.rounds.buffer(), buf, 1e-6f);
}

// Two islands of one speed (0.1 s a step, H = 10: a beat of 1 s), the second 0.4 s behind the
// first: once both speeds are known (third pushes), the first keeps H and the beat starts at its
// push (3.0 s); the second is told 6 steps, so its next push falls on the beat with the first's
// (4.0 s), and H again from there on. Islands that drift apart push together again within a round,
// with no island waiting for another.
TEST(Rounds, AsyncSetsHSoThatIslandsPushOnTheBeat) {
  const RoundsConfig c{.mode = OuterMode::async, .inner_steps = 10, .delay = 2};
  Fixture f(c);
  const uint64_t a = f.join(), b = f.join();
  struct Step {
    uint64_t id;
    int64_t ms;
    uint32_t steps;
    double seconds;
    uint32_t next_h;
    double push_in_s;  // to the beat
  };
  const Step steps[] = {{a, 1000, 10, 1.0, 10, 0},
                        {b, 1400, 10, 1.0, 10, 0},  // no speed yet
                        {a, 2000, 10, 1.0, 10, 0},
                        {b, 2400, 10, 1.0, 10, 0},    // one round counted
                        {a, 3000, 10, 1.0, 10, 1.0},  // the beat starts here
                        {b, 3400, 10, 1.0, 6, 0.6},   // 0.6 s to the beat at 4.0 s
                        {a, 4000, 10, 1.0, 10, 1.0},  // together
                        {b, 4000, 6, 0.6, 10, 1.0},
                        // b's steps got faster (0.05 s): the beat shrinks to 0.86 s from the beat
                        // at 5.0 s on, which stays where the islands head for
                        {b, 4500, 10, 0.5, 6, 0.5}};
  for (size_t k = 0; k < std::size(steps); ++k) {
    const Step& s = steps[k];
    Rounds::Pushed p;
    ASSERT_FALSE(f.push(s.id, f.rounds.version(), model(2 + k), s.ms, &p, s.steps, s.seconds)) << k;
    EXPECT_EQ(p.inner_steps, s.next_h) << k;
    EXPECT_NEAR(p.push_in_s, s.push_in_s, 1e-9) << k;
  }
}

TEST(Rounds, ResumingASavedStateKeepsMembersWithFreshLeasesAndLosesTheOpenRound) {
  Fixture f({.lease_s = 1});
  uint64_t a = f.join(0, "a"), b = f.join(0, "b");
  ASSERT_FALSE(f.push(a, 0, model(2)));
  ASSERT_FALSE(f.push(b, 0, model(3)));
  ASSERT_FALSE(f.push(a, 1, model(4)));  // in flight
  const StateMeta meta = f.rounds.meta();
  EXPECT_EQ(meta.version, 1u);
  EXPECT_EQ(meta.total_steps, 15);
  EXPECT_EQ(meta.next_id, 3u);
  ASSERT_EQ(meta.members.size(), 2u);
  EXPECT_EQ(meta.members.at(b).name, "b");
  EXPECT_DOUBLE_EQ(meta.members.at(a).sec_per_step, 0.0);  // known from a third push

  Fixture g({.lease_s = 1});
  g.rounds.resume({meta, *f.rounds.params(), f.rounds.momentum(), f.rounds.buffer()}, g.at(5000));
  EXPECT_EQ(g.rounds.version(), 1u);
  EXPECT_EQ(g.rounds.members(), 2u);
  expect_same(*g.rounds.params(), *f.rounds.params());
  EXPECT_EQ(g.rounds.round_state(a, 0, 1), RoundState::resend);
  EXPECT_EQ(g.members_at(5999), 2u);  // leases from 5000 ms
  ASSERT_FALSE(g.push(a, 1, model(4), 5500));
  ASSERT_FALSE(g.push(b, 1, model(5), 5500));
  EXPECT_EQ(g.rounds.version(), 2u);
  EXPECT_EQ(g.join(5500), 3u);  // ids go on from the saved next_id
}

// Issue 16's stable identity: an island restarted under its key gets its id back (its data stream
// follows the id), is not a second member, and a round under way stops waiting for the old process
// at once (not when its lease runs out); the keys survive a server restart.
TEST(Rounds, ARestartedIslandRejoinsUnderItsIdAndStopsBlockingTheRound) {
  Fixture f({.lease_s = 60});
  const uint64_t a = f.join(0, "a", "host:/runs/a"), b = f.join(0, "b", "host:/runs/b");
  ASSERT_FALSE(f.push(a, 0, model(2)));
  ASSERT_FALSE(f.push(b, 0, model(3)));
  ASSERT_EQ(f.rounds.version(), 1u);
  ASSERT_FALSE(f.push(a, 1, model(4), 100));  // round 2 under way; b is killed before its push
  EXPECT_EQ(f.rounds.version(), 1u);
  // b restarts (loom train --resume on its run dir) long before its lease of 60 s runs out
  EXPECT_EQ(f.join(200, "b again", "host:/runs/b"), b);
  EXPECT_EQ(f.rounds.members(), 2u);
  EXPECT_EQ(f.rounds.version(), 2u) << "the round still waited for the dead process";
  EXPECT_NE(f.lines.back().find("closed"), std::string::npos) << f.lines.back();
  ASSERT_FALSE(f.push(a, 2, model(5), 300));
  ASSERT_FALSE(f.push(b, 2, model(6), 300));  // expected again from round 3
  EXPECT_EQ(f.rounds.version(), 3u);
  EXPECT_EQ(f.join(400, "c", "host:/runs/c"), 3u);  // a new key: a new island
  Rounds::Joined j;
  expect_refused(f.rounds.join("x", f.init, f.at(500), &j, std::string(kMaxKeyBytes + 1, 'k')),
                 RefusalKind::invalid);
  // the server restarts: the keys come back with the state
  Fixture g({.lease_s = 60});
  g.rounds.resume({f.rounds.meta(), *f.rounds.params(), f.rounds.momentum(), f.rounds.buffer()},
                  g.at(0));
  EXPECT_EQ(g.join(0, "a again", "host:/runs/a"), a);
  EXPECT_EQ(g.join(0, "new", "host:/runs/d"), 4u);
}

// [outer] delay = 0: the Delayed Nesterov period is the islands that are members at each push, so a
// period stays one push per island when one leaves (a fixed N = 3 would make every period after
// it span two of each island's rounds, and an island awaiting its period wait a round for it).
TEST(Rounds, TheAsyncPeriodFollowsTheLiveMembers) {
  Fixture f({.mode = OuterMode::async, .lease_s = 60});
  const uint64_t a = f.join(), b = f.join(), c = f.join();
  Rounds::Pushed p;
  ASSERT_FALSE(f.push(a, 0, model(2), 0, &p));
  EXPECT_EQ(p.period, 1u);
  ASSERT_FALSE(f.push(b, 0, model(3), 0, &p));
  EXPECT_EQ(f.rounds.periods(), 0u);  // three members: the third push closes the period
  ASSERT_FALSE(f.push(c, 0, model(4), 0, &p));
  EXPECT_EQ(p.period, 1u);
  EXPECT_EQ(f.rounds.periods(), 1u);         // this push closed it
  for (const Tensor& t : f.rounds.buffer())  // the momentum step took the buffer
    for (float x : t.data) EXPECT_EQ(x, 0.f);
  ASSERT_FALSE(f.rounds.leave(c, f.at(0)));
  ASSERT_FALSE(f.push(a, 3, model(5), 0, &p));
  EXPECT_EQ(p.period, 2u);
  EXPECT_EQ(f.rounds.periods(), 1u);  // two members now
  ASSERT_FALSE(f.push(b, 3, model(6), 0, &p));
  EXPECT_EQ(p.period, 2u);
  EXPECT_EQ(f.rounds.periods(), 2u);
}

// A period is one beat: when an island pushes again before the others of its period did (they
// stalled, or missed the beat), the period closes first without them, with its momentum step on
// what it holds, and the push opens the next; an island awaiting the period (Await's period) gets
// it then, not a beat later. With [outer] delay = N a period is N pushes, whoever made them.
TEST(Rounds, AnIslandPushingAgainClosesItsPeriodFirst) {
  Fixture f({.mode = OuterMode::async, .lease_s = 60});
  const uint64_t a = f.join(), b = f.join(), c = f.join();
  TensorList want = f.init, m = zeros_like(want), buf = zeros_like(want);
  int64_t count = 0;
  const OuterOptConfig opt = RoundsConfig{}.opt;
  Rounds::Pushed p;
  ASSERT_FALSE(f.push(a, 0, model(2), 0, &p));
  ASSERT_FALSE(f.push(b, 0, model(3), 0, &p));
  delayed_nesterov_push(opt, 3, want, m, buf, count, model(2));
  delayed_nesterov_push(opt, 3, want, m, buf, count, model(3));
  ASSERT_FALSE(f.push(a, 1, model(4), 0, &p));  // c missed the beat
  delayed_nesterov_close(opt, 3, want, m, buf, count);
  delayed_nesterov_push(opt, 3, want, m, buf, count, model(4));
  EXPECT_EQ(f.rounds.periods(), 1u);
  EXPECT_EQ(p.period, 2u);
  EXPECT_EQ(p.version, 3u);  // one version a push still
  expect_same(*f.rounds.params(), want, 1e-6f);
  expect_same(f.rounds.momentum(), m, 1e-6f);
  ASSERT_FALSE(f.push(c, 0, model(5), 0, &p));  // late: in the next period
  ASSERT_FALSE(f.push(b, 2, model(6), 0, &p));  // its third push closes it
  delayed_nesterov_push(opt, 3, want, m, buf, count, model(5));
  delayed_nesterov_push(opt, 3, want, m, buf, count, model(6));
  EXPECT_EQ(p.period, 2u);
  EXPECT_EQ(f.rounds.periods(), 2u);
  expect_same(*f.rounds.params(), want, 1e-6f);
  expect_same(f.rounds.momentum(), m, 1e-6f);
  expect_same(f.rounds.buffer(), buf, 1e-6f);

  Fixture g({.mode = OuterMode::async, .delay = 3, .lease_s = 60});
  const uint64_t x = g.join(), y = g.join();
  ASSERT_FALSE(g.push(x, 0, model(2), 0, &p));
  ASSERT_FALSE(g.push(y, 0, model(3), 0, &p));
  ASSERT_FALSE(g.push(x, 1, model(4), 0, &p));  // N = 3 pushes, whoever made them
  EXPECT_EQ(p.period, 1u);
  EXPECT_EQ(g.rounds.periods(), 1u);
}

// Quantised updates: every commit (a sync round of a fragment, an async push) is old + the decoding
// of the update's int4 chunks, bit for bit, and the chunks are kept for one version only.
TEST(Rounds, QuantisedUpdatesAreCommittedAsTheirChunksDecode) {
  auto decoded = [](const TensorList& spec, const std::vector<proto::TensorChunk>& chunks) {
    Assembler as(spec);
    for (const auto& c : chunks) EXPECT_EQ(as.add(c), "");
    EXPECT_EQ(as.finish(), "");
    return as.tensors();
  };
  auto expect_bitwise = [](const TensorList& a, const TensorList& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t)
      for (size_t i = 0; i < a[t].data.size(); ++i)
        ASSERT_EQ(a[t].data[i], b[t].data[i]) << a[t].name << "[" << i << "]";
  };
  const Time t{};
  {  // sync, two fragments
    const TensorList init = layered(1);
    Rounds r({.fragments = 2, .update_encoding = proto::INT4}, init);
    Rounds::Joined j;
    ASSERT_FALSE(r.join("a", init, t, &j));
    const TensorList g = gather(layered(2), r.fragment_tensors(1));
    Rounds::Pushed p;
    ASSERT_FALSE(r.push({j.island_id, 0, 5, 0.5, 1}, g, t, &p));
    ASSERT_EQ(r.version(1), 1u);
    EXPECT_EQ(r.update(0, 0), nullptr);  // fragment 0 has not moved
    auto u = r.update(1, 0);
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->front().encoding(), proto::INT4);
    TensorList want = gather(init, r.fragment_tensors(1));
    const TensorList d = decoded(want, *u);
    for (size_t k = 0; k < want.size(); ++k)
      for (size_t i = 0; i < want[k].data.size(); ++i) want[k].data[i] += d[k].data[i];
    expect_bitwise(gather(*r.params(), r.fragment_tensors(1)), want);
    ASSERT_FALSE(r.push({j.island_id, 1, 5, 0.5, 1}, g, t, &p));
    EXPECT_EQ(r.update(1, 0), nullptr);  // two versions on: none
    EXPECT_NE(r.update(1, 1), nullptr);
  }
  {  // async: each push
    const TensorList init = model(1);
    Rounds r({.mode = OuterMode::async, .update_encoding = proto::INT8}, init);
    Rounds::Joined j;
    ASSERT_FALSE(r.join("a", init, t, &j));
    Rounds::Pushed p;
    ASSERT_FALSE(r.push({j.island_id, 0, 5, 0.5}, model(2), t, &p));
    auto u = r.update(0, 0);
    ASSERT_NE(u, nullptr);
    TensorList want = init;
    const TensorList d = decoded(init, *u);
    for (size_t k = 0; k < want.size(); ++k)
      for (size_t i = 0; i < want[k].data.size(); ++i) want[k].data[i] += d[k].data[i];
    expect_bitwise(*r.params(), want);
  }
}

TEST(Rounds, ABadConfigIsAnError) {
  EXPECT_THROW({ Rounds r({.inner_steps = 0}, model(1)); }, Error);
  EXPECT_THROW({ Rounds r({.lease_s = 0}, model(1)); }, Error);
  // streaming fragments are sync rounds; and a model without layers has one fragment
  EXPECT_THROW({ Rounds r({.mode = OuterMode::async, .fragments = 2}, layered(1)); }, Error);
  EXPECT_THROW({ Rounds r({.fragments = 2}, model(1)); }, Error);
}

}  // namespace
}  // namespace loom::outer
