// loom plan: predict a config's training step on a cluster before running it (sim/). The step is
// compiled exactly as `loom train` and `loom bench` compile it (the scheduled per-rank program
// under the config's [plan] and [passes]; without a plan, the one-process training graph), then
// simulated on the cluster file's device and network levels.
//
//   loom plan C.toml [--cluster F.toml] [--devices N] [--set k=v ...] [--compare P.toml] [--json]
//             [--kernels K.json]
//
// --compare names a TOML file of [[plan]] tables (each with mesh, tactics, optional name and
// passes = { ... }) predicted one after another on the same model and batch. --json prints one JSON
// line per plan instead of the table. --kernels writes the distinct compute kernels of the
// predicted programs (op, attributes, operand types, how many a step runs, their cost and the
// predicted seconds of one) as JSON: what bench/gpu/torch_kernels.py times on a GPU, and
// `loom calibrate --import` turns back into a cluster file's [profile].
// The figures are search::predict's (src/loom/search/predict.h says what each means).
#include "plan.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>
#include <variant>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/passes/synthesize.h"
#include "loom/search/predict.h"
#include "loom/sim/cluster.h"
#include "loom/sim/p2.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom::cli {

namespace {

// The [[plan]] tables of a --compare file, each as --set overrides of the config.
std::vector<std::pair<std::string, std::vector<std::string>>> compare_plans(
    const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(read_file(path), path);
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{}: not valid TOML: {}", path, std::string(e.description())));
  }
  const toml::array* plans = root["plan"].as_array();
  if (!plans || plans->empty()) throw Error(fmt::format("{}: needs [[plan]] tables", path));
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (size_t i = 0; i < plans->size(); ++i) {
    const toml::table* t = (*plans)[i].as_table();
    if (!t) throw Error(fmt::format("{}: plan {}: expected a [[plan]] table", path, i));
    std::string name = fmt::format("plan {}", i);
    std::vector<std::string> sets;
    // a TOML value as --set's right-hand side (a string quoted, anything else as TOML writes it)
    auto text = [](const toml::node& v) {
      if (v.is_string()) return "\"" + *v.value<std::string>() + "\"";
      std::ostringstream os;
      os << toml::toml_formatter(v, toml::format_flags::none);
      return os.str();
    };
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (key == "name") {
        if (!v.is_string())
          throw Error(fmt::format("{}: plan {}: name: expected a string", path, i));
        name = *v.value<std::string>();
      } else if (key == "mesh" || key == "tactics" || key == "ranks") {
        sets.push_back("plan." + key + "=" + text(v));
      } else if (key == "passes") {
        if (!v.is_table())
          throw Error(fmt::format("{}: plan {}: passes: expected a table", path, i));
        for (const auto& [pk, pv] : *v.as_table())
          sets.push_back("passes." + std::string(pk.str()) + "=" + text(pv));
      } else {
        throw Error(fmt::format("{}: plan {}: unknown key {} (name, mesh, tactics, ranks, passes)",
                                path, i, key));
      }
    }
    out.push_back({name, sets});
  }
  return out;
}

}  // namespace

std::string fmt_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.3g} GB", b / 1e9);
  return fmt::format("{:.3g} MB", b / 1e6);
}

void explain_reductions(train::Config cfg, const sim::Cluster& cl) {
  if (cfg.plan.plan.empty()) {
    fmt::print("\nno plan: nothing is reduced across ranks\n");
    return;
  }
  cfg.passes.synthesize = false;  // the program's reductions as lowering makes them
  const train::CompiledStep step =
      train::compile_step(cfg, passes::StepKind::train, true, cfg.plan.plan.mesh.size());
  const shard::Mesh& mesh = cfg.plan.plan.mesh;
  std::vector<std::string> names;
  for (const auto& [a, n] : mesh.axes()) names.push_back(a);
  // one entry per distinct (axes, bytes), with how many reductions a step has of it
  std::map<std::pair<std::vector<std::string>, int64_t>, int> seen;
  for (const passes::Reduction& r : passes::reductions(step.c.rank.graph, mesh))
    ++seen[{r.axes, int64_t(r.bytes)}];
  fmt::print(
      "\nreductions ({}; [passes] synthesize = {}): the flat all_reduce and the fastest "
      "synthesized programs\n",
      cl.name, cfg.passes.synthesize ? "true" : "false");
  for (const auto& [key, count] : seen) {
    const auto& [axes, bytes] = key;
    const std::vector<sim::p2::Factor> f = sim::p2::reduction_factors(mesh, cl, axes);
    std::string ax;
    for (const std::string& a : axes) ax += (ax.empty() ? "" : "+") + a;
    if (f.size() > 6) continue;
    const uint32_t all = (1u << f.size()) - 1;
    const double flat = sim::p2::flat_seconds(f, all, double(bytes), cl);
    const auto progs = sim::p2::synthesize(f, all, double(bytes), cl, 5, false);
    fmt::print("  {} x {} over {}: flat all_reduce {:.3f} ms\n", count, fmt_bytes(double(bytes)),
               ax, flat * 1e3);
    for (size_t i = 0; i < progs.size() && i < 3; ++i)
      fmt::print("    {:.3f} ms  {}\n", progs[i].seconds * 1e3, progs[i].text(f, names));
  }
}

// "name value, ..." for the entries of `by` (name -> ms) at or above 2% of `total`, largest
// first, each value as `show` writes its ms
std::string largest_shares(const nlohmann::json& by, double total,
                           const std::function<std::string(double)>& show) {
  std::vector<std::pair<double, std::string>> all;
  for (const auto& [name, t] : by.items()) all.push_back({t.get<double>(), name});
  std::sort(all.rbegin(), all.rend());
  std::string line;
  for (const auto& [t, name] : all)
    if (total > 0 && t >= 0.02 * total)
      line += fmt::format("{}{} {}", line.empty() ? "" : ", ", name, show(t));
  return line;
}

void print_predictions(const std::vector<nlohmann::json>& rows) {
  fmt::print("{:<16} {:>12} {:>10} {:>14} {:>6} {:>6} {:>10} {:>10} {:>5} {:>12}\n", "plan", "mesh",
             "step ms", "tok/s/device", "MFU", "HFU", "exposed", "peak", "fits", "kWh/Mtok");
  for (const auto& r : rows) {
    fmt::print(
        "{:<16} {:>12} {:>10.1f} {:>14.1f} {:>5.1f}% {:>5.1f}% {:>7.1f} ms {:>10} {:>5} "
        "{:>12.4g}\n",
        r["plan"].get<std::string>(), r["mesh"].get<std::string>(), r["step_ms"].get<double>(),
        r["tokens_per_s_per_device"].get<double>(), 100 * r["mfu"].get<double>(),
        100 * r["hfu"].get<double>(), r["exposed_comm_ms"].get<double>(),
        fmt_bytes(r["peak_bytes"].get<double>()), r["fits"].get<bool>() ? "yes" : "NO",
        r["energy_kwh_per_mtok"].get<double>());
    if (r.contains("candidate")) fmt::print("{:<16} {}\n", "", r["candidate"].get<std::string>());
    std::string lv;
    for (const auto& [l, b] : r["bytes_per_level"].items())
      lv += fmt::format("{}{} {}", lv.empty() ? "" : ", ", l, fmt_bytes(b.get<double>()));
    if (!lv.empty()) fmt::print("{:<16} sent per device per step: {}\n", "", lv);
    // where the compute stream's time goes (ops), and what it waited for (collectives by op and
    // axis, a stage's recvs): each entry above 2% of its total, largest first
    const std::string ops = largest_shares(
        r["compute_ms_by_op"], r["compute_ms"].get<double>(),
        [&](double t) { return fmt::format("{:.0f}%", 100 * t / r["compute_ms"].get<double>()); });
    if (!ops.empty()) fmt::print("{:<16} compute: {}\n", "", ops);
    const std::string waits = largest_shares(r["exposed_ms_by"], r["exposed_comm_ms"].get<double>(),
                                             [](double t) { return fmt::format("{:.0f} ms", t); });
    if (!waits.empty()) fmt::print("{:<16} exposed: {}\n", "", waits);
    if (r.contains("stages")) {  // a pipeline: each stage's compute, and the one it waits most in
      const auto& st = r["stages"];
      size_t lo = 0, hi = 0;
      for (size_t s = 0; s < st.size(); ++s) {
        if (st[s]["compute_ms"].get<double>() < st[lo]["compute_ms"].get<double>()) lo = s;
        if (st[s]["compute_ms"].get<double>() > st[hi]["compute_ms"].get<double>()) hi = s;
      }
      fmt::print("{:<16} stages: compute {:.0f} ms (stage {}) to {:.0f} ms (stage {})\n", "",
                 st[lo]["compute_ms"].get<double>(), lo, st[hi]["compute_ms"].get<double>(), hi);
    }
  }
}

std::function<int()> add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  CLI::App* s = app.add_subcommand("plan", "predict a plan's step time, memory and energy (sim)");
  s->add_option("config", o->config, "config TOML")->required();
  s->add_option("--cluster", o->cluster, "cluster file (default clusters/local.toml)");
  s->add_option("--devices", o->devices, "devices (default: the cluster's, else the mesh's)")
      ->check(whole_number(1, 1 << 24));
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  s->add_option("--compare", o->compare, "a TOML file of [[plan]] tables to predict side by side");
  s->add_flag("--json", o->json, "one JSON line per plan");
  s->add_option("--kernels", o->kernels,
                "write the programs' distinct compute kernels as JSON (for a GPU's timings)");
  s->add_flag("--explain", o->explain,
              "print each reduction's synthesized programs (P2) and their predicted times");
  add_search_options(*s, *o);
  return [o]() {
    if (!o->kernels.empty())  // before the prediction: its result is not lost at the end
      check_output("--kernels", o->kernels, {{"config", o->config}, {"--cluster", o->cluster}});
    if (o->search.on) {
      if (!o->compare.empty() || !o->kernels.empty())
        throw Error("loom plan: --search takes neither --compare nor --kernels",
                    "search for a plan, then predict it with --compare or --kernels");
      return run_plan_search(*o);
    }
    const auto cl = std::make_shared<const sim::Cluster>(sim::load_cluster(o->cluster));
    std::vector<std::pair<std::string, std::vector<std::string>>> plans{{"config", {}}};
    if (!o->compare.empty()) plans = compare_plans(o->compare);
    std::vector<nlohmann::json> rows;
    nlohmann::json kernels = nlohmann::json::object();
    for (const auto& [name, extra] : plans) {
      std::vector<std::string> sets = o->sets;
      sets.insert(sets.end(), extra.begin(), extra.end());
      const train::Config cfg = train::load_config(o->config, sets);
      rows.push_back(
          search::predict(cfg, cl, o->devices, name, o->kernels.empty() ? nullptr : &kernels));
      if (o->json) fmt::print("{}\n", rows.back().dump());
    }
    if (!o->kernels.empty()) {
      nlohmann::json doc;
      doc["config"] = o->config;
      doc["cluster"] = cl->source;
      doc["kernels"] = nlohmann::json::array();
      for (const auto& [sig, k] : kernels.items()) doc["kernels"].push_back(k);
      write_file_atomic(o->kernels, doc.dump(1) + "\n");
    }
    if (o->json) return 0;
    fmt::print("cluster {} ({}), model {} {}\n", cl->name, cl->source, o->config,
               rows.front()["devices"].get<int64_t>() > 1 ? "" : "(one device)");
    print_predictions(rows);
    if (o->explain) {
      train::Config cfg = train::load_config(o->config, o->sets);
      explain_reductions(cfg, *cl);
    }
    return 0;
  };
}

}  // namespace loom::cli
