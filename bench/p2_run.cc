// P² for real: every program sim::p2 synthesizes for one reduction (all_reduce, reduce_scatter and
// all_gather over sub-groups: what lowering can emit) run under mpirun on a buffer, against the
// flat all_reduce over the whole group (one of them). Each program is a per-rank graph of
// collectives run by the executor on split communicators (runtime::MeshComms), as a training step
// runs them; its time is the slowest rank's, the median of REPS runs after a warm-up. Each rank's
// input is small integers, so every program's sum is exact and must equal the expected sum element
// for element.
//
//   mpirun -np 4 p2_run CLUSTER.toml MESH AXES BYTES [REPS]
//     MESH "x=4" or "a=2,b=2" (row-major, the last axis innermost, as [plan] mesh), AXES the
//     reduced ones, comma-separated
//
// Rank 0 prints one JSON line per program (predicted and measured ms, the predicted and measured
// rank) and a summary: the measured rank of the simulator's first, and the flat all_reduce's time
// against the best synthesized one's, measured and predicted.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/comm/mpi.h"
#include "loom/core/error.h"
#include "loom/ops/builder.h"
#include "loom/passes/synthesize.h"
#include "loom/runtime/collectives.h"
#include "loom/runtime/executor.h"
#include "loom/sim/p2.h"

namespace {

using namespace loom;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, sep);) out.push_back(x);
  return out;
}

// The graph of one program over a 1-D f32 buffer of n elements.
ir::Graph program_graph(const shard::Mesh& mesh, const std::vector<sim::p2::Factor>& f,
                        const sim::p2::Program& p, int64_t n) {
  ir::Graph g("p2");
  ops::Builder b(g);
  const int x = g.add_input("x", {DType::f32, {n}}, ir::ValueKind::input);
  g.add_output(passes::emit_program(b, x, mesh, f, p, "x"));  // as the synthesize pass emits it
  return g;
}

int run(int argc, char** argv) {
  if (argc < 5) {
    fmt::print(stderr, "usage: p2_run CLUSTER.toml MESH AXES BYTES [REPS]\n");
    return 2;
  }
  const sim::Cluster cl = sim::load_cluster(argv[1]);
  std::vector<std::pair<std::string, int64_t>> axes;
  for (const std::string& a : split(argv[2], ',')) {
    const auto kv = split(a, '=');
    if (kv.size() != 2) throw Error(fmt::format("p2_run: mesh '{}': expected NAME=SIZE", a));
    axes.push_back({kv[0], std::stoll(kv[1])});
  }
  const shard::Mesh mesh(axes, "p2_run mesh");
  const std::vector<std::string> reduced = split(argv[3], ',');
  const double bytes = std::atof(argv[4]);
  const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
  const int64_t n = int64_t(bytes / 4);

  comm::MpiSession session;
  auto world = comm::mpi_world();
  if (world->size() != mesh.size())
    throw Error(fmt::format("p2_run: {} ranks for the mesh {}", world->size(), mesh.to_string()));
  const int rank = world->rank();
  runtime::MeshComms comms(*world, mesh);

  std::vector<std::string> names;
  for (const auto& [a, s] : axes) names.push_back(a);
  const std::vector<sim::p2::Factor> f = sim::p2::reduction_factors(mesh, cl, reduced);
  const uint32_t all = (1u << f.size()) - 1;
  std::vector<sim::p2::Program> programs = sim::p2::synthesize(f, all, bytes, cl, 5, false);
  // those the buffer divides
  std::erase_if(programs,
                [&](const sim::p2::Program& p) { return !sim::p2::splits_evenly(p, f, n); });

  // inputs: small integers, exact in f32 whatever the order of the additions
  std::vector<float> in(static_cast<size_t>(n)), want(static_cast<size_t>(n), 0.0f);
  auto value = [](int64_t r, int64_t i) { return float((r * 7 + i) % 13); };
  for (int64_t i = 0; i < n; ++i) in[size_t(i)] = value(rank, i);
  // the expected sum over the ranks of this rank's reduction group
  const std::string whole = sim::p2::group_spec(mesh, f, all);
  for (int64_t r = 0; r < mesh.size(); ++r)
    if (mesh.group_color(r, whole) == mesh.group_color(rank, whole))
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += value(r, i);

  std::vector<nlohmann::json> rows;
  for (size_t pi = 0; pi < programs.size(); ++pi) {
    const sim::p2::Program& p = programs[pi];
    const ir::Graph g = program_graph(mesh, f, p, n);
    comms.prepare(g);
    runtime::Executor ex(g);
    ex.set_comms(&comms);
    std::vector<float> buf;
    std::vector<double> times;
    bool exact = true;
    for (int r = 0; r < reps + 1; ++r) {
      buf = in;
      ex.bind(0, buf.data());
      world->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      ex.run();
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<double> all_t(size_t(world->size()));
      world->all_gather(&t, all_t.data(), sizeof(double));
      if (r > 0) times.push_back(*std::max_element(all_t.begin(), all_t.end()));
      const float* out = ex.ptr<float>(g.outputs()[0]);
      exact = exact && std::equal(want.begin(), want.end(), out);
    }
    int ok = exact ? 1 : 0, all_ok = 0;
    {
      std::vector<int> oks(size_t(world->size()));
      world->all_gather(&ok, oks.data(), sizeof(int));
      all_ok = int(std::count(oks.begin(), oks.end(), 1) == world->size());
    }
    std::sort(times.begin(), times.end());
    nlohmann::json j;
    j["program"] = p.text(f, names);
    j["steps"] = p.steps.size();
    j["flat"] = p.steps.size() == 1;
    j["predicted_ms"] = p.seconds * 1e3;
    j["predicted_rank"] = pi + 1;
    j["measured_ms"] = times[times.size() / 2] * 1e3;
    j["exact"] = bool(all_ok);
    rows.push_back(j);
  }
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return rows[a]["measured_ms"].get<double>() < rows[b]["measured_ms"].get<double>();
  });
  for (size_t k = 0; k < order.size(); ++k) rows[order[k]]["measured_rank"] = k + 1;
  if (rank == 0) {
    const nlohmann::json* flat = nullptr;
    const nlohmann::json* best_synth = nullptr;
    bool exact = true;
    for (const auto& r : rows) {
      fmt::print("{}\n", r.dump());
      exact = exact && r["exact"].get<bool>();
      if (r["flat"].get<bool>())
        flat = &r;
      else if (!best_synth ||
               r["measured_ms"].get<double>() < (*best_synth)["measured_ms"].get<double>())
        best_synth = &r;
    }
    nlohmann::json s;
    s["cluster"] = cl.name;
    s["mesh"] = mesh.to_string();
    s["reduce"] = argv[3];
    s["bytes"] = bytes;
    s["programs"] = rows.size();
    s["every_program_exact"] = exact;
    s["simulator_first_measured_rank"] = rows.front()["measured_rank"];
    s["simulator_first"] = rows.front()["program"];
    if (flat && best_synth) {
      s["flat_ms"] = (*flat)["measured_ms"];
      s["flat_predicted_ms"] = (*flat)["predicted_ms"];
      s["simulator_first_ms"] = rows.front()["measured_ms"];
      s["measured_speedup_of_simulator_first"] =
          (*flat)["measured_ms"].get<double>() / rows.front()["measured_ms"].get<double>();
      s["predicted_speedup_of_simulator_first"] =
          (*flat)["predicted_ms"].get<double>() / rows.front()["predicted_ms"].get<double>();
    }
    fmt::print("{}\n", s.dump());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    fmt::print(stderr, "p2_run: {}\n", e.what());
    loom::comm::mpi_abort(1);
    return 1;
  }
}
