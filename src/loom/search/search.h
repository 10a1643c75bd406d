// Plan search: `loom plan C.toml --cluster F.toml --search [--budget SECONDS] [--devices N]`.
//
// The reward is the simulator's: a candidate (space.h) is compiled as `loom train` would compile
// it and simulated on the cluster (predict.h); its reward is 1 / step time, and a candidate whose
// predicted peak memory exceeds the device's, or that does not compile, earns 0 (device memory is
// a hard limit). The training graph is compiled once and every candidate is sharded from it
// (passes::compile_on); a candidate is evaluated once however often the search reaches it.
//
// Monte Carlo Tree Search (UCT): each tree node is a decision prefix. An iteration walks from the
// root choosing, while every option of a node has a child, the child of highest
//   Q + c sqrt(ln N / n),   Q = (mean reward + best reward) / 2 / best reward seen anywhere,
// expands one untried option at random, completes the plan by uniformly random decisions (the
// rollout), evaluates it, and adds the reward to every node on the path. Best-reward backup suits
// a search for one best plan (single-player MCTS); the mean keeps it from chasing one lucky
// rollout. A subtree whose every candidate is evaluated is closed, so the search ends by itself on
// a space it has exhausted. c = 1/sqrt(2) (Kocsis and Szepesvari's constant for rewards in [0, 1]),
// fixed, not tuned on the spaces the benchmark reports.
//
// The last quarter of the budget (of the evaluations when they are limited, and of the seconds)
// goes to a local search from the best plan the tree found: its neighbours (Space::neighbours: one
// decision changed, a pass setting, an axis's role or the mesh; two axes swapped, which places the
// same tactics otherwise on the cluster's levels; two axes merged into one) are evaluated, moving
// to the first that is faster, until none is left; what budget the climb leaves goes back to the
// tree. The tree finds the region (mesh and roles); the leaves' many near-equal pass settings are
// where a random rollout most often stops short of the optimum (docs/benchmarks.md: the first
// runs, without it), and a mesh one placement or one merge from a faster one is where it stopped
// on Llama 70B (the same tactics with tensor parallelism across nodes).
//
// The exhaustive enumerator evaluates every candidate of the same space: the baseline on spaces
// small enough.
//
// Evaluations run on `jobs` threads (compiling and simulating a candidate reads only the cached
// training graph). The tree keeps `jobs` rollouts in flight: a rollout's path counts its visit
// when it is chosen and its reward when its evaluation ends (a virtual loss: the next choice,
// seeing the visit without the reward, goes elsewhere), and a rollout that reaches a candidate in
// flight waits for that one's reward. The climb evaluates `jobs` neighbours at a time and moves to
// the fastest that improves. With one job the search is the sequential one, and deterministic
// for a given seed and evaluation limit; with more, which evaluation ends first decides the order.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/passes/pass.h"
#include "loom/search/space.h"
#include "loom/sim/cluster.h"
#include "loom/train/config.h"

namespace loom::search {

struct Evaluation {
  Candidate candidate;
  bool ok = false;    // compiled and simulated
  std::string error;  // why not (!ok)
  double step_s = 0;
  int64_t peak_bytes = 0;
  bool fits = false;       // peak within the device's memory
  double seconds = 0;      // what evaluating it took
  int64_t index = 0;       // its place in the order of evaluation (0: first)
  nlohmann::json figures;  // predict()'s figures
  double reward() const { return ok && fits && step_s > 0 ? 1.0 / step_s : 0.0; }
};

// Compiles and simulates candidates of one config on one cluster, each once.
class Evaluator {
 public:
  // Compiles cfg's training graph (throws loom::Error for a config that does not compile).
  Evaluator(train::Config cfg, std::shared_ptr<const sim::Cluster> cluster, int64_t devices);

  const Evaluation& evaluate(const Candidate& c);
  // Compiles and simulates c without recording it: safe on several threads at once.
  Evaluation compute(const Candidate& c) const;
  // Keeps an evaluation compute() made (the first of a candidate; a second is dropped), numbering
  // it in the order recorded.
  const Evaluation& record(Evaluation e);
  const Evaluation* find(const Candidate& c) const;
  int64_t evaluations() const { return int64_t(done_.size()); }
  // Every evaluation: those that fit by step time, then the rest by peak memory.
  std::vector<const Evaluation*> ranked() const;

  const train::Config& config() const { return cfg_; }
  const passes::Compilation& trained() const { return trained_; }
  const sim::Cluster& cluster() const { return *cluster_; }
  int64_t devices() const { return devices_; }

 private:
  train::Config cfg_;
  std::shared_ptr<const sim::Cluster> cluster_;
  int64_t devices_;
  passes::Compilation trained_;
  std::map<std::string, Evaluation> done_;
};

struct SearchOptions {
  double budget_s = 60;         // wall-clock seconds
  int64_t max_evaluations = 0;  // 0: no limit but the budget
  uint64_t seed = 0;
  bool exhaustive = false;    // evaluate every candidate instead
  double local_share = 0.25;  // of the budget, for the local search after the tree
  int jobs = 1;               // evaluations at once, each on a thread of its own
};

struct SearchResult {
  int64_t evaluations = 0;  // candidates compiled and simulated by this search
  int64_t iterations = 0;   // MCTS iterations (one per rollout)
  double seconds = 0;
  bool exhausted = false;            // every candidate of the space was evaluated
  int64_t best_at = -1;              // evaluations up to and including the best one (-1: none fits)
  const Evaluation* best = nullptr;  // the fastest that fits
  const Evaluation* closest = nullptr;  // none fits: the one of least peak memory
};

SearchResult search(const Space& space, Evaluator& ev, const SearchOptions& o);

}  // namespace loom::search
