// Plan search on the tiny Llama: the space's pruning, the candidates as configs, the cached
// training graph against a full compile, MCTS against the exhaustive enumerator, and the errors.
#include "loom/search/search.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/search/predict.h"

namespace loom::search {
namespace {

const std::string kSrc = LOOM_SOURCE_DIR;

train::Config tiny(int64_t batch = 4) {
  return train::load_config(kSrc + "/configs/tiny-llama.toml",
                            {"train.batch_size=" + std::to_string(batch), "train.seq_len=32"});
}

std::shared_ptr<const sim::Cluster> h100() {
  return std::make_shared<const sim::Cluster>(sim::load_cluster(kSrc + "/clusters/h100-sxm.toml"));
}

TEST(Space, OffersEachRoleOnceOneTensorParallelAxisAndADivisibleBatch) {
  for (int64_t batch : {4, 2}) {
    Evaluator ev(tiny(batch), h100(), 4);
    Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 4});
    const auto all = s.enumerate();
    ASSERT_FALSE(all.empty());
    std::set<std::string> keys;
    for (const auto& d : all) {
      const Candidate c = s.candidate(d);
      EXPECT_TRUE(keys.insert(c.key()).second) << "twice: " << c.key();
      int64_t size = 1, batch_ways = 1, tp = 0, stages = 0;
      std::set<int> seen;
      for (size_t a = 0; a < c.mesh.size(); ++a) {
        size *= c.mesh[a].second;
        const Role& r = roles()[size_t(c.roles[a])];
        EXPECT_TRUE(seen.insert(c.roles[a]).second) << c.key();
        if (r.name == "pipeline")
          stages = c.mesh[a].second;
        else if (r.splits_batch)
          batch_ways *= c.mesh[a].second;
        tp += r.order == 0;
        EXPECT_NE(r.name, "expert") << "a dense model offers no expert axis: " << c.key();
      }
      EXPECT_EQ(size, 4) << c.key();
      EXPECT_LE(tp, 1) << c.key();
      EXPECT_EQ(batch % batch_ways, 0) << c.key();
      // a pipeline's micro-batches: a multiple of its stages, each split over the data axes
      EXPECT_EQ(c.microbatches > 0, stages > 0) << c.key();
      if (stages > 0) {
        EXPECT_EQ(c.microbatches % stages, 0) << c.key();
        EXPECT_EQ(batch % (c.microbatches * batch_ways), 0) << c.key();
        EXPECT_TRUE(c.schedule == "1f1b" || c.schedule == "interleaved") << c.key();
      }
    }
    // batch 2 on 4 devices: no plan splits the batch four ways
    if (batch == 2)
      for (const auto& d : all) {
        const Candidate c = s.candidate(d);
        EXPECT_FALSE(c.mesh.size() == 1 && roles()[size_t(c.roles[0])].splits_batch) << c.key();
      }
  }
}

// The climb's moves: every neighbour is a candidate of the space one move away (one decision, two
// axes swapped, two axes merged), and the moves that matter for placement are there: from tensor
// parallelism across "nodes" to within one, and from two data-parallel axes to one.
TEST(Space, NeighboursAreOneDecisionASwapOrAMergeAway) {
  Evaluator ev(tiny(4), h100(), 4);
  Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 4});
  std::set<std::string> space;
  std::vector<int> from;
  for (const auto& d : s.enumerate()) {
    const Candidate c = s.candidate(d);
    space.insert(c.key());
    if (c.key() ==
        "{model=2:megatron,fsdp=2:fsdp} recompute=selective bucket=auto "
        "reshard_after_forward=false")
      from = d;
  }
  ASSERT_FALSE(from.empty());
  const Candidate c0 = s.candidate(from);
  std::set<std::string> keys;
  for (const auto& d : s.neighbours(from)) {
    ASSERT_TRUE(s.complete(d));
    const Candidate c = s.candidate(d);
    EXPECT_TRUE(space.count(c.key())) << c.key();
    EXPECT_TRUE(keys.insert(c.key()).second) << "twice: " << c.key();
    EXPECT_NE(c.key(), c0.key());
  }
  // swapped: the same tactics, tensor parallelism innermost; the pass settings kept
  EXPECT_TRUE(
      keys.count("{fsdp=2:fsdp,model=2:megatron} recompute=selective bucket=auto "
                 "reshard_after_forward=false"));
  // merged, with either role (reshard after forward has no fsdp to matter without it)
  EXPECT_TRUE(
      keys.count("{fsdp=4:fsdp} recompute=selective bucket=auto "
                 "reshard_after_forward=false"));
  EXPECT_TRUE(
      keys.count("{model=4:megatron} recompute=selective bucket=auto "
                 "reshard_after_forward=true"));
  // one decision: a pass setting, and a role
  EXPECT_TRUE(
      keys.count("{model=2:megatron,fsdp=2:fsdp} recompute=full bucket=auto "
                 "reshard_after_forward=false"));
  EXPECT_TRUE(
      keys.count("{model=2:megatron,zero2=2:zero2} recompute=selective bucket=auto "
                 "reshard_after_forward=true"));
}

// A pipeline is offered where it can run: not beside a tied embedding (GPT-2's head reads the
// first stage's table), not beside grad_accum (its micro-batches are the accumulation), and not
// over more stages than parameter groups (the tiny Llama has 4).
TEST(Space, OffersAPipelineOnlyWhereItCanRun) {
  auto pipelines = [](const train::Config& cfg, int64_t devices) {
    Evaluator ev(cfg, h100(), devices);
    Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = devices});
    int n = 0;
    for (const auto& d : s.enumerate()) n += s.candidate(d).microbatches > 0;
    return n;
  };
  EXPECT_GT(pipelines(tiny(8), 4), 0);
  EXPECT_EQ(pipelines(train::load_config(kSrc + "/configs/tiny-gpt2.toml",
                                         {"train.batch_size=8", "train.seq_len=32"}),
                      4),
            0);
  EXPECT_EQ(pipelines(train::load_config(
                          kSrc + "/configs/tiny-llama.toml",
                          {"train.batch_size=8", "train.seq_len=32", "train.grad_accum=2"}),
                      4),
            0);
  // 8 devices: pipe = 2 or 4 beside other axes, never 8 stages of the tiny Llama's 4 groups
  Evaluator ev(tiny(8), h100(), 8);
  Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 8});
  int pipes = 0;
  for (const auto& d : s.enumerate()) {
    const Candidate c = s.candidate(d);
    for (size_t a = 0; a < c.mesh.size(); ++a)
      if (roles()[size_t(c.roles[a])].name == "pipeline") {
        ++pipes;
        EXPECT_LT(c.mesh[a].second, 8) << c.key();
      }
  }
  EXPECT_GT(pipes, 0);
}

TEST(Space, OneDeviceIsTheEmptyPlanUnderEachRecompute) {
  Evaluator ev(tiny(), h100(), 1);
  Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 1});
  const auto all = s.enumerate();
  EXPECT_EQ(all.size(), 3u);  // none, selective, full; bucketing cannot matter
  for (const auto& d : all) EXPECT_TRUE(s.candidate(d).mesh.empty());
}

// P²'s synthesized reductions as a decision: offered only when asked (a cluster of several levels),
// each synthesized candidate has its flat twin, and on two hosts of two ranks with one link each
// the data-parallel plan's gradient all-reduce split over the levels is predicted faster.
TEST(Space, SynthesisIsADecisionWhereRanksCommunicate) {
  const auto two =
      std::make_shared<const sim::Cluster>(sim::load_cluster(kSrc + "/clusters/two-hosts.toml"));
  Evaluator ev(tiny(), two, 4);
  const Space flat(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 4});
  for (const auto& d : flat.enumerate()) EXPECT_FALSE(flat.candidate(d).synthesize);
  const Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles,
                {.devices = 4, .synthesize = true});
  const auto all = s.enumerate();
  EXPECT_EQ(all.size(), 2 * flat.enumerate().size());
  std::set<std::string> keys;
  for (const auto& d : all) keys.insert(s.candidate(d).key());
  const Evaluation* fast = nullptr;
  const Evaluation* slow = nullptr;
  for (const auto& d : all) {
    const Candidate c = s.candidate(d);
    if (!c.synthesize) continue;
    Candidate twin = c;
    twin.synthesize = false;
    EXPECT_TRUE(keys.count(twin.key())) << c.key();
    if (c.mesh.size() == 1 && c.mesh[0].first == "data" &&
        c.recompute == passes::ScheduleOptions::Recompute::none &&
        c.bucket == passes::ScheduleOptions::Bucket::block) {
      fast = &ev.evaluate(c);
      slow = &ev.evaluate(twin);
    }
  }
  ASSERT_TRUE(fast && slow);
  ASSERT_TRUE(fast->ok && slow->ok) << fast->error << slow->error;
  EXPECT_LT(fast->step_s, slow->step_s);
  EXPECT_NE(fast->candidate.toml("two-hosts.toml").find("synthesize = true"), std::string::npos);
}

// A candidate's TOML, appended to the config, is the same plan: what the search prints can be
// pasted.
TEST(Candidate, TomlLoadsBackAsTheSamePlan) {
  Evaluator ev(tiny(), h100(), 4);
  Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 4});
  const auto dir = std::filesystem::temp_directory_path() / "loom_search_test";
  std::filesystem::create_directories(dir);
  const std::string base = read_file(kSrc + "/configs/tiny-llama.toml");
  int checked = 0, pipelines = 0;
  for (const auto& d : s.enumerate()) {
    const Candidate c = s.candidate(d);
    const std::string path = (dir / "c.toml").string();
    write_file_atomic(path, base + "\n" + c.toml(kSrc + "/clusters/h100-sxm.toml"));
    const train::Config back = train::load_config(path);
    train::Config want = tiny();
    c.apply(want);
    EXPECT_EQ(back.plan.plan.mesh.to_string(), want.plan.plan.mesh.to_string()) << c.key();
    ASSERT_EQ(back.plan.plan.tactics.size(), want.plan.plan.tactics.size()) << c.key();
    for (size_t i = 0; i < want.plan.plan.tactics.size(); ++i) {
      const shard::Tactic &b = back.plan.plan.tactics[i], &w = want.plan.plan.tactics[i];
      EXPECT_EQ(b.kind, w.kind);
      EXPECT_EQ(b.axis, w.axis);
      if (w.kind != "pipeline") continue;
      ++pipelines;
      EXPECT_EQ(b.schedule, w.schedule) << c.key();
      EXPECT_EQ(b.microbatches, w.microbatches) << c.key();
      EXPECT_EQ(shard::pipeline_virtual_stages(b), shard::pipeline_virtual_stages(w)) << c.key();
    }
    EXPECT_EQ(back.passes.recompute, c.recompute) << c.key();
    if (!c.mesh.empty()) {
      EXPECT_EQ(back.passes.bucket, c.bucket) << c.key();
      EXPECT_EQ(back.passes.reshard_after_forward, c.reshard_after_forward) << c.key();
    }
    ++checked;
  }
  EXPECT_GT(checked, 20);
  EXPECT_GT(pipelines, 0) << "the space offers no pipeline";
  std::filesystem::remove_all(dir);
}

// Sharding each candidate from the one compiled training graph predicts what compiling it whole
// does.
TEST(Evaluator, TheCachedTrainingGraphPredictsWhatAFullCompileDoes) {
  Evaluator ev(tiny(), h100(), 4);
  Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 4});
  const auto all = s.enumerate();
  for (size_t i = 0; i < all.size(); i += 7) {
    const Candidate c = s.candidate(all[i]);
    const Evaluation& e = ev.evaluate(c);
    ASSERT_TRUE(e.ok) << c.key() << ": " << e.error;
    train::Config cfg = tiny();
    c.apply(cfg);
    const nlohmann::json whole = predict(cfg, h100(), 4, c.key());
    EXPECT_EQ(e.figures.dump(), whole.dump()) << c.key();
  }
}

TEST(Search, MctsWithoutALimitExhaustsTheSpaceAndFindsTheExhaustiveOptimum) {
  Evaluator ex(tiny(), h100(), 4), mc(tiny(), h100(), 4);
  Space s(ex.config(), ex.trained().model.graph, ex.trained().model.roles, {.devices = 4});
  const SearchResult re = search(s, ex, {.budget_s = 600, .exhaustive = true});
  ASSERT_TRUE(re.exhausted);
  ASSERT_NE(re.best, nullptr);
  EXPECT_EQ(re.evaluations, int64_t(s.enumerate().size()));
  const SearchResult rm = search(s, mc, {.budget_s = 600, .seed = 3});
  EXPECT_TRUE(rm.exhausted);
  EXPECT_EQ(rm.evaluations, re.evaluations) << "each candidate evaluated once";
  ASSERT_NE(rm.best, nullptr);
  EXPECT_EQ(rm.best->step_s, re.best->step_s);
  // a limit is kept
  Evaluator lim(tiny(), h100(), 4);
  const SearchResult rl = search(s, lim, {.budget_s = 600, .max_evaluations = 5});
  EXPECT_EQ(rl.evaluations, 5);
  EXPECT_FALSE(rl.exhausted);
}

// Evaluations on several threads: every candidate evaluated once, to the same figures as one at
// a time (the exhaustive run and the tree, which exhausts the space too), and the limit kept; with
// one job, a seed's search is deterministic (the same evaluations in the same order).
TEST(Search, ParallelEvaluationsGiveTheSequentialFigures) {
  Evaluator one(tiny(), h100(), 4);
  Space s(one.config(), one.trained().model.graph, one.trained().model.roles, {.devices = 4});
  const SearchResult r1 = search(s, one, {.budget_s = 600, .exhaustive = true, .jobs = 1});
  ASSERT_TRUE(r1.exhausted);
  for (const SearchOptions& o : {SearchOptions{.budget_s = 600, .exhaustive = true, .jobs = 3},
                                 SearchOptions{.budget_s = 600, .seed = 1, .jobs = 3}}) {
    Evaluator par(tiny(), h100(), 4);
    const SearchResult r = search(s, par, o);
    EXPECT_TRUE(r.exhausted);
    EXPECT_EQ(r.evaluations, r1.evaluations);
    for (const Evaluation* e : par.ranked()) {
      const Evaluation* want = one.find(e->candidate);
      ASSERT_NE(want, nullptr) << e->candidate.key();
      EXPECT_EQ(e->ok, want->ok) << e->candidate.key();
      EXPECT_EQ(e->step_s, want->step_s) << e->candidate.key();
      EXPECT_EQ(e->peak_bytes, want->peak_bytes) << e->candidate.key();
    }
    ASSERT_NE(r.best, nullptr);
    EXPECT_EQ(r.best->step_s, r1.best->step_s);
  }
  Evaluator lim(tiny(), h100(), 4);
  EXPECT_EQ(search(s, lim, {.budget_s = 600, .max_evaluations = 7, .jobs = 3}).evaluations, 7);
  std::vector<std::string> order[2];
  for (int run : {0, 1}) {
    Evaluator ev(tiny(), h100(), 4);
    search(s, ev, {.budget_s = 600, .max_evaluations = 20, .seed = 2, .jobs = 1});
    auto all = ev.ranked();
    std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->index < b->index; });
    for (const Evaluation* e : all) order[run].push_back(e->candidate.key());
  }
  EXPECT_EQ(order[0], order[1]);
}

TEST(Search, NoPlanFitsNamesTheClosestAndABudgetMustBePositive) {
  sim::Cluster small = sim::load_cluster(kSrc + "/clusters/h100-sxm.toml");
  small.device.memory_bytes = 1e5;  // 100 kB: nothing fits
  Evaluator ev(tiny(), std::make_shared<const sim::Cluster>(small), 2);
  Space s(ev.config(), ev.trained().model.graph, ev.trained().model.roles, {.devices = 2});
  const SearchResult r = search(s, ev, {.budget_s = 600, .exhaustive = true});
  EXPECT_EQ(r.best, nullptr);
  ASSERT_NE(r.closest, nullptr);
  for (const Evaluation* e : ev.ranked())
    if (e->ok) {
      EXPECT_LE(r.closest->peak_bytes, e->peak_bytes);
    }
  EXPECT_THROW(search(s, ev, {.budget_s = 0}), Error);
  EXPECT_THROW(search(s, ev, {.budget_s = -1}), Error);
}

}  // namespace
}  // namespace loom::search
