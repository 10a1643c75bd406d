// P² in simulation: over every two-axis mesh of a cluster's devices, every placement of it onto the
// cluster's levels and every reduction over one or both axes, the fastest synthesized program
// (search/p2.h) against the flat all_reduce, as the simulator costs both. One JSON line per case,
// then a summary (cases, how many the synthesized program beats, the largest and mean speedup).
//
//   p2_bench [CLUSTER.toml] [DEVICES] [BYTES]   (default clusters/h100-sxm.toml 32 268435456)
#include <fmt/format.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/core/error.h"
#include "loom/sim/p2.h"

int main(int argc, char** argv) {
  using namespace loom;
  try {
    const std::string file = argc > 1 ? argv[1] : "clusters/h100-sxm.toml";
    const int64_t devices = argc > 2 ? std::atoll(argv[2]) : 32;
    const double bytes = argc > 3 ? std::atof(argv[3]) : 268435456.0;
    const sim::Cluster c = sim::load_cluster(file);
    int cases = 0, beaten = 0;
    double best_speedup = 0, sum_speedup = 0;
    for (int64_t a = 2; a <= devices / 2; ++a) {
      if (devices % a) continue;
      const std::vector<int64_t> mesh{a, devices / a};
      const std::vector<std::string> names{"x", "y"};
      for (const auto& f : sim::p2::placements(mesh, c, devices)) {
        for (uint32_t axes : {1u, 2u, 3u}) {
          uint32_t reduce = 0;
          for (size_t i = 0; i < f.size(); ++i)
            if (axes >> f[i].axis & 1) reduce |= 1u << i;
          const auto programs = sim::p2::synthesize(f, reduce, bytes, c);
          const double flat = sim::p2::flat_seconds(f, reduce, bytes, c);
          const double speedup = flat / programs.front().seconds;
          ++cases;
          beaten += speedup > 1.001;
          best_speedup = std::max(best_speedup, speedup);
          sum_speedup += speedup;
          std::string placement;
          for (const auto& x : f)
            placement += fmt::format("{}{}:{}@{}", placement.empty() ? "" : " ",
                                     names[size_t(x.axis)], x.size, c.levels[size_t(x.level)].name);
          nlohmann::json j;
          j["mesh"] = fmt::format("{{x = {}, y = {}}}", mesh[0], mesh[1]);
          j["placement"] = placement;
          j["reduce"] = axes == 3 ? "x,y" : axes == 1 ? "x" : "y";
          j["programs"] = programs.size();
          j["flat_ms"] = flat * 1e3;
          j["best_ms"] = programs.front().seconds * 1e3;
          j["speedup"] = speedup;
          j["best"] = programs.front().text(f, names);
          fmt::print("{}\n", j.dump());
        }
      }
    }
    nlohmann::json s;
    s["cluster"] = c.name;
    s["devices"] = devices;
    s["bytes"] = bytes;
    s["cases"] = cases;
    s["synthesized_faster"] = beaten;
    s["max_speedup"] = best_speedup;
    s["mean_speedup"] = cases ? sum_speedup / cases : 0;
    fmt::print("{}\n", s.dump());
  } catch (const Error& e) {
    fmt::print(stderr, "p2_bench: {}\n", e.what());
    return 1;
  }
}
