// Distributed parity under mpirun: the plan_parity cases whose mesh has as many ranks as this job,
// run with ranks as MPI processes. Every rank also computes the one-rank reference itself; rank 0
// compares and prints one line per case. Exit 0 only if every case ran and matched (a job whose
// size fits no case fails: nothing is skipped).
//
//   mpirun -np 2 plan_parity_mpi      (data, fsdp, zero1, zero2, megatron, megatron+sequence, ...)
//   mpirun -np 4 plan_parity_mpi      (data4, fsdp x megatron on 2x2, tiny and mid)
//   mpirun -np 8 plan_parity_mpi      (pipeline x fsdp x megatron on 2x2x2)
// The pipeline cases (plan_parity.h's pipeline_cases) run among them, training only.
#include <cstdio>

#include "loom/comm/mpi.h"
#include "plan_parity.h"

using namespace loom;
using namespace loom::train;
using namespace loom::train::parity;

int main() {
  comm::MpiSession session;
  auto world = comm::mpi_world();
  int failed = 0, ran = 0;
  try {
    std::vector<Case> all = cases();
    const size_t pipelines = all.size();  // from here on: training only (no gradients step)
    for (const Case& c : pipeline_cases()) all.push_back(c);
    for (size_t i = 0; i < all.size(); ++i) {
      const Case& c = all[i];
      Config cfg = parity::config(c);
      if (cfg.plan.plan.mesh.size() != world->size()) continue;
      runtime::MeshComms mc(*world, cfg.plan.plan.mesh);
      TrainRun got = train_run(cfg, &mc);
      std::map<std::string, std::vector<float>> grads;
      if (i < pipelines) grads = grads_run(cfg, &mc);
      if (world->rank() != 0) continue;
      TrainRun ref = train_run(single(cfg), nullptr);
      auto errs = compare_training(got, ref);
      if (i < pipelines)
        for (const auto& e : compare_grads(grads, grads_run(single(cfg), nullptr)))
          errs.push_back(e);
      ++ran;
      double worst = 0;
      for (size_t i = 0; i < ref.losses.size(); ++i)
        worst = std::max(worst,
                         std::abs(double(got.losses[i]) - ref.losses[i]) / std::abs(ref.losses[i]));
      std::printf("%s %s on %d ranks: %zu steps, worst relative loss difference %.2g\n",
                  errs.empty() ? "ok  " : "FAIL", c.name.c_str(), world->size(), ref.losses.size(),
                  worst);
      for (const auto& e : errs) std::printf("     %s\n", e.c_str());
      failed += !errs.empty();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_parity_mpi: rank %d: %s\n", world->rank(), e.what());
    comm::mpi_abort(1);
  }
  if (world->rank() == 0) {
    if (ran == 0) std::printf("FAIL no case has a mesh of %d ranks\n", world->size());
    std::printf("plan_parity_mpi: %d case(s), %d failed\n", ran, failed);
  }
  std::fflush(stdout);
  int bad = world->rank() == 0 ? (failed || ran == 0) : 0;
  world->broadcast(&bad, sizeof bad, 0);
  return bad;
}
