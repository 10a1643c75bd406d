// The islands front door called directly: two islands of the tiny model against a server, and the
// refusals that come before any process starts.
#include "loom/outer/islands.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "loom/core/error.h"
#include "loom/outer/testing.h"
#include "loom/outer/yield.h"

namespace loom::outer {
namespace {

namespace fs = std::filesystem;

using test::TempDir;  // testing.h: a fresh directory under /tmp, removed at the end

// Words drawn from a small vocabulary: text a tiny byte-level model learns within a few steps.
std::string write_text(const fs::path& parent) {
  const fs::path dir = parent / "data";
  fs::create_directories(dir);
  const char* words[] = {"the", "island", "trains", "a", "model", "and", "sends", "its", "update"};
  std::mt19937 rng(3);
  for (const char* name : {"a.txt", "b.txt", "c.txt"}) {
    std::ofstream out(dir / name);
    for (int i = 0; i < 6000; ++i) out << words[rng() % 9] << (i % 12 == 11 ? "\n" : " ");
  }
  return dir.string();
}

IslandsOptions tiny(const TempDir& d, const std::string& data) {
  IslandsOptions o;
  o.config = std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml";
  o.run_dir = d.path + "/run";
  o.islands = 2;
  o.loom_binary = LOOM_BINARY;
  o.sets = {"data.path=" + data, "train.steps=8", "train.eval_every=0", "outer.inner_steps=4",
            "outer.mode=\"sync\""};
  return o;
}

TEST(Islands, TwoIslandsMeetEveryRoundAndTheGlobalModelIsEvaluated) {
  TempDir d;
  const std::string data = write_text(d.path);
  std::vector<std::string> lines;
  IslandsOptions o = tiny(d, data);
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  const IslandsResult r = run_islands(o);
  const nlohmann::json& s = r.summary;
  EXPECT_EQ(s["islands"], 2);
  EXPECT_EQ(s["version"], 2u);  // 8 steps, H = 4: two rounds
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
  EXPECT_LT(s["val_loss"].get<double>(), std::log(256.0));  // learnt something: below uniform
  ASSERT_EQ(s["per_island"].size(), 2u);
  double most = 0;
  for (const auto& isl : s["per_island"]) {
    EXPECT_EQ(isl["steps"], 8);
    EXPECT_EQ(isl["outer_round"], 2);
    // the share of its wall time an island spent waiting for the server: some (a push and a pull
    // take time), never more than all
    const double w = isl["wait_share_total"].get<double>();
    EXPECT_GT(w, 0);
    EXPECT_LE(w, 1);
    most = std::max(most, w);
  }
  EXPECT_EQ(s["wait_share_max"].get<double>(), most);
  for (int i = 0; i < 2; ++i) {  // and each round's share, in the island's metrics
    std::ifstream in(fmt::format("{}/island_{}/metrics.jsonl", r.run_dir, i));
    int rounds = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("outer_round")) continue;
      ++rounds;
      const double w = j["wait_share"].get<double>(), total = j["wait_share_total"].get<double>();
      EXPECT_GT(w, 0) << line;
      EXPECT_LE(w, 1) << line;
      EXPECT_GT(total, 0) << line;
      EXPECT_LE(total, 1) << line;
      EXPECT_FALSE(j.contains("ahead_steps")) << line;  // async only: a sync island waits
    }
    EXPECT_EQ(rounds, 2) << "island " << i;
  }
  EXPECT_TRUE(fs::exists(r.run_dir + "/summary.json"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("starting 2 islands"), std::string::npos) << lines[0];
}

// Async: an island never waits for another. Island 1 stalls for 5 s before its third step (its
// heartbeat alive, so it stays a member of every Delayed Nesterov period); island 0 pushes, takes
// what the server holds and goes on, spending the whole step budget (2 islands x 8 steps) alone
// while island 1 sleeps, and waits for the server for a small part of those 5 s.
TEST(Islands, AnAsyncIslandNeverWaitsForAStalledOne) {
  TempDir d;
  IslandsOptions o = tiny(d, write_text(d.path));
  o.sets.back() = "outer.mode=\"async\"";
  o.sets.push_back("outer.islands=2");
  o.stalls = {{1, "3:5"}};
  const IslandsResult r = run_islands(o);
  const nlohmann::json& s = r.summary;
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
  EXPECT_GE(s["wall_s"].get<double>(), 5);  // island 1 slept
  const nlohmann::json& fast = s["per_island"][0];
  EXPECT_EQ(fast["steps"], 16);  // the budget, alone: 2 x [train] steps
  EXPECT_LT(fast["wait_s"].get<double>(), 2.5);
  // it trains again after its stall, until its first push's reply says the budget is spent
  EXPECT_GE(s["per_island"][1]["steps"], 4);
  // island 0's periods wait on island 1 until island 0 pushes again: it takes the newest version
  // then, so each of its rounds was trained ahead of its period, every step of it
  std::ifstream in(r.run_dir + "/island_0/metrics.jsonl");
  int64_t most = 0, yielded = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("outer_round")) continue;  // a step without a sync
    ASSERT_TRUE(j.contains("ahead_steps")) << line;
    const int64_t a = j["ahead_steps"].get<int64_t>();
    EXPECT_GE(a, 0) << line;
    EXPECT_LE(a, 8) << line;  // at most twice H = 4 after a push
    most = std::max(most, a);
    yielded = j["yield_steps"].get<int64_t>();  // so far
  }
  EXPECT_GE(most, 2);
  // [outer] yield (on): those steps ran at idle CPU priority, where this process may do so
  if (can_idle()) {
    EXPECT_GE(yielded, most);
    EXPECT_LE(yielded, fast["steps"].get<int64_t>());
  } else {
    EXPECT_EQ(yielded, 0);
  }
}

TEST(Islands, RefusalsComeBeforeAnyProcess) {
  TempDir d;
  IslandsOptions o = tiny(d, write_text(d.path));
  o.islands = 0;
  EXPECT_THROW(run_islands(o), Error);
  o = tiny(d, "");
  o.sets.erase(o.sets.begin());  // no [data] path
  try {
    run_islands(o);
    FAIL() << "ran without data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[data] path is not set"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(o.run_dir));
  EXPECT_THROW(parse_slowdowns({"5=3"}, 2), Error);
  EXPECT_THROW(parse_slowdowns({"1=0.5"}, 2), Error);
  EXPECT_THROW(parse_slowdowns({"x"}, 2), Error);
  EXPECT_EQ(parse_slowdowns({"1=3"}, 2).at(1), "3");
  for (const char* bad : {"2=3:1", "1=0:1", "1=3", "1=3:0", "1=3:x", "x=3:1", "1=3:1 "})
    EXPECT_THROW(parse_stalls({bad}, 2), Error) << bad;
  EXPECT_THROW(parse_stalls({"1=3:1", "1=4:1"}, 2), Error);  // one per island
  EXPECT_EQ(parse_stalls({"1=3:2.5"}, 2).at(1), "3:2.5");
}

}  // namespace
}  // namespace loom::outer
