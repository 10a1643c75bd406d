#include "ranks.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "loom/comm/local.h"
#include "loom/comm/mpi.h"
#include "loom/core/error.h"
#include "loom/train/step.h"

namespace loom::cli {

int run_ranks(const train::Config& cfg, const std::function<int(const runtime::MeshComms*)>& fn) {
  const shard::Plan& plan = cfg.plan.plan;
  if (plan.empty()) return fn(nullptr);
  train::check_plan(cfg);
  const int n = int(plan.mesh.size());
  if (cfg.plan.ranks == "local") {
    const int threads = std::max(1, omp_get_max_threads() / n);
    comm::run_local(n, [&](comm::Communicator& c) {
      omp_set_num_threads(threads);
      runtime::MeshComms mc(c, plan.mesh);
      fn(&mc);
    });
    return 0;
  }
  if (!comm::MpiSession::launched_by_mpirun())
    throw Error(
        fmt::format("{}: the mesh {} has {} ranks and ranks = \"mpi\", but this process was "
                    "not started by mpirun",
                    plan.where, plan.mesh.to_string(), n),
        fmt::format("run mpirun -np {} loom ..., or set [plan] ranks = \"local\" to run the "
                    "ranks as threads of this process",
                    n));
  comm::MpiSession session;
  auto world = comm::mpi_world();
  if (world->size() != n)
    throw Error(fmt::format("{}: the mesh {} has {} ranks, but mpirun started {}", plan.where,
                            plan.mesh.to_string(), n, world->size()),
                fmt::format("run mpirun -np {}, or change [plan] mesh", n));
  int rc = 0;
  try {
    runtime::MeshComms mc(*world, plan.mesh);
    rc = fn(&mc);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: error on rank %d of %d: %s\n", world->rank(), n, e.what());
    std::fflush(stderr);
    comm::mpi_abort(1);
  }
  return rc;
}

}  // namespace loom::cli
