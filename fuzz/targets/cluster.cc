// Cluster files (`loom plan --cluster F`, `loom calibrate --base F`): the text parsed, then a mesh
// placed on its levels and a collective costed over an axis and a sub-group of it, as `loom plan`
// does with every file it reads.
#include "loom/sim/cluster.h"

#include "fuzz/fuzz.h"
#include "loom/sim/cost.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const loom::sim::Cluster c = loom::sim::parse_cluster(text, "fuzz.toml");
    const loom::shard::Mesh mesh({{"x", 4}, {"y", 2}});
    const loom::sim::Placement p = loom::sim::place(mesh, c, 0);
    for (const char* group : {"x", "y", "x[2:2]+y"}) {
      const int level = loom::sim::group_level(mesh, c, p, group);
      const double load = loom::sim::link_load(loom::ir::Op::all_reduce, mesh, c, level, group);
      if (!(load >= 1)) std::abort();
      const double t = loom::sim::collective_seconds(loom::ir::Op::all_reduce, 1 << 20,
                                                     mesh.group_size(group), c, level, load);
      if (!(t >= 0)) std::abort();
    }
  });
  return 0;
}
