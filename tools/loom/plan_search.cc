// loom plan --search: the plan the simulator predicts fastest for a config on a cluster, found by
// Monte Carlo Tree Search (or --exhaustive enumeration) over meshes, tactics and pass settings
// (src/loom/search/). Prints the top plans with their predicted figures and the winner as
// [plan] and [passes] sections to paste into the config; with --json, one line per top plan and a
// last line summarising the search.
//
// Errors: a budget or evaluation count that is not positive, a config that does not compile;
// "no plan fits" (exit 1) with the closest candidate's peak memory when none fits the device.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/search/search.h"
#include "loom/sim/cluster.h"
#include "loom/train/config.h"
#include "plan.h"

namespace loom::cli {

void add_search_options(CLI::App& s, PlanOpts& o) {
  s.add_flag("--search", o.search.on,
             "search for the fastest plan that fits (meshes, tactics, pass settings)");
  s.add_option("--budget", o.search.budget_s, "--search: seconds to search (default 60)")
      ->check(finite_number(1e-9, 1e9));
  s.add_option("--evals", o.search.evaluations, "--search: at most this many plans evaluated")
      ->check(whole_number(1, INT32_MAX));
  s.add_flag("--exhaustive", o.search.exhaustive,
             "--search: evaluate every plan of the space (the baseline) instead of MCTS");
  s.add_option("--seed", o.search.seed, "--search: the tree search's random seed (default 0)")
      ->check(whole_number(0, INT64_MAX));
  s.add_option("--top", o.search.top, "--search: how many plans to print (default 5)")
      ->check(whole_number(1, 1 << 20));
  s.add_option("--max-axes", o.search.max_axes, "--search: mesh axes at most (default 3)")
      ->check(whole_number(1, 4));
  s.add_option("--jobs", o.search.jobs,
               "--search: evaluations at once, each on a thread (default: one per hardware "
               "thread; 1: sequential and, with --evals, deterministic for a seed)")
      ->check(whole_number(1, 1024));
  s.add_option("--log", o.search.log,
               "--search: write every evaluated plan as a JSON line, in the order evaluated");
}

int run_plan_search(const PlanOpts& o) {
  if (!o.search.log.empty())
    check_output("--log", o.search.log, {{"config", o.config}, {"--cluster", o.cluster}});
  const auto cl = std::make_shared<const sim::Cluster>(sim::load_cluster(o.cluster));
  const train::Config cfg = train::load_config(o.config, o.sets);
  const int64_t devices = o.devices > 0 ? o.devices : (cl->devices > 0 ? cl->devices : 1);
  search::Evaluator ev(cfg, cl, devices);
  search::SpaceOptions so;
  so.devices = devices;
  so.max_axes = o.search.max_axes;
  // synthesized reductions can matter only where the devices span more than the innermost level
  so.synthesize = cl->levels.size() > 1 && cl->levels[0].size > 0 && devices > cl->levels[0].size;
  const search::Space space(ev.config(), ev.trained().model.graph, ev.trained().model.roles, so);
  search::SearchOptions opt;
  opt.budget_s = o.search.budget_s;
  opt.max_evaluations = o.search.evaluations;
  opt.exhaustive = o.search.exhaustive;
  opt.seed = o.search.seed;
  opt.jobs =
      o.search.jobs > 0 ? o.search.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
  const search::SearchResult r = search::search(space, ev, opt);

  const auto ranked = ev.ranked();
  if (!o.search.log.empty()) {
    std::vector<const search::Evaluation*> order = ranked;
    std::sort(order.begin(), order.end(),
              [](const auto* a, const auto* b) { return a->index < b->index; });
    std::string text;
    for (const search::Evaluation* e : order) {
      nlohmann::json j;
      j["index"] = e->index;
      j["candidate"] = e->candidate.key();
      j["ok"] = e->ok;
      if (!e->ok) j["error"] = e->error;
      j["step_ms"] = e->step_s * 1e3;
      j["peak_bytes"] = e->peak_bytes;
      j["fits"] = e->fits;
      j["seconds"] = e->seconds;
      text += j.dump() + "\n";
    }
    write_file_atomic(o.search.log, text);
  }
  if (!r.best) {
    // the space was not looked at, not found empty
    if (r.evaluations == 0 && !r.exhausted && r.seconds >= o.search.budget_s)
      throw Error(fmt::format("{}: --budget {} s ran out before a plan was evaluated ({:.3g} s)",
                              o.config, o.search.budget_s, r.seconds),
                  "a larger --budget (one evaluation of this model takes longer)");
    if (!r.closest) {
      const std::string why =
          ranked.empty() ? "the model splits over them in no way the space holds (each axis's "
                           "tactics refused, or the batch not divisible)"
                         : "none compiles: " + ranked.front()->error;
      throw Error(
          fmt::format("{}: no plan fits {} devices of {}: {}", o.config, devices, cl->name, why),
          "another device count, or a larger batch");
    }
    throw Error(
        fmt::format("{}: no plan fits {} devices of {} ({} each): the closest, {}, needs {} at "
                    "its peak ({} plans evaluated)",
                    o.config, devices, cl->name, fmt_bytes(cl->device.memory_bytes),
                    r.closest->candidate.key(), fmt_bytes(double(r.closest->peak_bytes)),
                    r.evaluations),
        "more devices, recompute, a smaller batch or sequence, or fsdp over more ranks");
  }
  double eval_s = 0;
  for (const search::Evaluation* e : ranked) eval_s += e->seconds;
  nlohmann::json summary;
  summary["search"] = o.search.exhaustive ? "exhaustive" : "mcts";
  summary["config"] = o.config;
  summary["cluster"] = cl->name;
  summary["devices"] = devices;
  summary["plans_in_space"] = space.enumerate().size();
  summary["evaluations"] = r.evaluations;
  summary["iterations"] = r.iterations;
  summary["seconds"] = r.seconds;
  summary["seconds_per_evaluation"] = r.evaluations ? eval_s / double(r.evaluations) : 0.0;
  summary["exhausted"] = r.exhausted;
  summary["best_at"] = r.best_at;
  summary["best"] = r.best->candidate.key();
  summary["best_step_ms"] = r.best->step_s * 1e3;
  summary["seed"] = o.search.seed;
  summary["jobs"] = opt.jobs;

  std::vector<nlohmann::json> rows;
  for (const search::Evaluation* e : ranked) {
    if (int64_t(rows.size()) == o.search.top || !e->ok || !e->fits) break;
    nlohmann::json row = e->figures;
    row["plan"] = fmt::format("#{}", rows.size() + 1);
    row["candidate"] = e->candidate.key();
    row["toml"] = e->candidate.toml(o.cluster);
    rows.push_back(std::move(row));
  }
  if (o.json) {
    for (const auto& row : rows) fmt::print("{}\n", row.dump());
    fmt::print("{}\n", summary.dump());
    return 0;
  }
  fmt::print(
      "plan search ({}) for {} on {} devices of {} ({}): {} of the space's {} plans evaluated in "
      "{:.1f} s ({:.3f} s each, {} at once){}; the best found after {}\n",
      summary["search"].get<std::string>(), o.config, devices, cl->name, cl->source, r.evaluations,
      summary["plans_in_space"].get<int64_t>(), r.seconds,
      summary["seconds_per_evaluation"].get<double>(), opt.jobs,
      r.exhausted ? ", the whole space" : "", r.best_at);
  print_predictions(rows);
  fmt::print("\nthe fastest plan that fits, to paste into {}:\n\n{}", o.config,
             r.best->candidate.toml(o.cluster));
  return 0;
}

}  // namespace loom::cli
