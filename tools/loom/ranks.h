// How a command that runs a training step starts its ranks, from the config's [plan]:
//   no [plan]            this process, unsharded: fn(nullptr)
//   ranks = "local"      one thread per rank of the mesh in this process (comm/local.h), the OpenMP
//                        threads shared out among them
//   ranks = "mpi"        this process is one rank of an mpirun job (comm/mpi.h)
// The plan is checked first, in this process (its errors name the tactic, value and axis, with no
// rank prefix). An error on one rank stops all of them: a local rank's error is rethrown naming the
// rank; an MPI rank prints it and aborts the job (the others may be waiting in a collective).
#pragma once

#include <functional>

#include "loom/runtime/collectives.h"
#include "loom/train/config.h"

namespace loom::cli {

int run_ranks(const train::Config& cfg, const std::function<int(const runtime::MeshComms*)>& fn);

}  // namespace loom::cli
