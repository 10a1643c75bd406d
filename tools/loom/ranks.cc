#include "ranks.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "loom/autodiff/autodiff.h"
#include "loom/comm/local.h"
#include "loom/comm/mpi.h"
#include "loom/core/error.h"
#include "loom/shard/lower.h"

namespace loom::cli {

namespace {

// The plan's errors before any rank starts (every rank would meet the same one): tactics, shardings
// and lowering of the training step, as each rank's StepRunner will do them.
void check_plan(const train::Config& cfg) {
  if (cfg.train.grad_accum > 1)
    throw Error(fmt::format("{}: [train] grad_accum > 1 with a [plan] is not supported yet", cfg.path),
                "raise [train] batch_size instead: the plan splits it across ranks");
  models::ModelGraph m = models::build_model(cfg.model, cfg.train.batch_size, cfg.train.seq_len);
  autodiff::build_train_step(m.graph, m.loss, cfg.optim);
  shard::shard_graph(m.graph, cfg.plan.plan, {.batch_inputs = {m.tokens, m.targets}},
                     cfg.plan.plan.mesh.size());
}

}  // namespace

int run_ranks(const train::Config& cfg, const std::function<int(const runtime::MeshComms*)>& fn) {
  const shard::Plan& plan = cfg.plan.plan;
  if (plan.empty()) return fn(nullptr);
  check_plan(cfg);
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
    throw Error(fmt::format("{}: the mesh {} has {} ranks and ranks = \"mpi\", but this process was "
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
