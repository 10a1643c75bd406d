// `loom plan`'s two files: predicting given plans (plan.cc) and searching for one (plan_search.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/sim/cluster.h"
#include "loom/train/config.h"

namespace loom::cli {

struct PlanSearchOpts {
  bool on = false;  // --search
  double budget_s = 60;
  int64_t evaluations = 0;  // --evals: at most this many (0: the budget decides)
  bool exhaustive = false;
  uint64_t seed = 0;
  int64_t top = 5;
  int max_axes = 3;
  int jobs = 0;     // --jobs: evaluations at once (0: one per hardware thread)
  std::string log;  // --log: every evaluation as a JSON line, in the order evaluated
};

struct PlanOpts {
  std::string config, cluster = "clusters/local.toml", compare, kernels;
  int64_t devices = 0;
  std::vector<std::string> sets;
  bool json = false;
  bool explain = false;
  PlanSearchOpts search;
};

std::string fmt_bytes(double b);  // "1.2 GB", "3.4 MB"
// The table of predictions (search::predict's JSON), one plan per row; a row's "candidate", when
// present, printed under it.
void print_predictions(const std::vector<nlohmann::json>& rows);
// --explain: each reduction of the config's plan (an all_reduce over one or more axes), with the
// flat all_reduce's predicted time and the three fastest synthesized programs (sim/p2.h).
void explain_reductions(train::Config cfg, const sim::Cluster& cl);

// --search and its flags (plan_search.cc).
void add_search_options(CLI::App& s, PlanOpts& o);
int run_plan_search(const PlanOpts& o);

}  // namespace loom::cli
