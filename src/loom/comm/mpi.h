// The MPI backend: one rank per process, started by mpirun (Open MPI on the dev machines).
//
// What it does: MpiSession initializes MPI (asking for MPI_THREAD_MULTIPLE: a rank's two
// communication threads, its host's and the network's, runtime/executor.h, run collectives while
// the rank computes; it needs MPI_THREAD_SERIALIZED at least, and then one thread runs them all)
// and finalizes it; mpi_world() returns a Communicator
// over a duplicate of MPI_COMM_WORLD. Collectives map one-to-one onto MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Bcast, MPI_Alltoall, MPI_Send/MPI_Recv, MPI_Barrier and
// MPI_Comm_split, one call per piece of at most chunk_bytes. f32 and i32 sums use MPI_SUM; bf16
// uses a user-defined MPI_Op that adds two bf16 in f32 and rounds back to bf16. What it does not:
// no CUDA-aware buffers, no non-blocking calls, no recovery. MPI does not promise a summation
// order, so unlike the local backend an f32 sum over more than 2 ranks may differ in the last bits
// from the rank-order sum (and bf16 rounds after each addition); Open MPI gives every rank the same
// result, which is what the trainers need.
//
// Key invariant: every MPI call goes through one checking wrapper (mpi.cc: mpi_call), and the
// communicators use MPI_ERRORS_RETURN, so a failed call throws loom::Error naming the call and
// MPI's error string instead of aborting without a word. An error on one rank must end the whole
// job: catch it at the top of main, print it, and call mpi_abort (the other ranks may be blocked in
// a collective). This header does not include <mpi.h>.
#pragma once

#include <memory>

#include "loom/comm/communicator.h"

namespace loom::comm {

class MpiSession {
 public:
  // Initializes MPI unless it already is (then checks its thread level); throws loom::Error on
  // failure.
  MpiSession();
  // Finalizes MPI if this session initialized it. Every rank must get here (it is collective): on
  // an error, call mpi_abort instead of unwinding past the session.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // Whether this process was started by mpirun/mpiexec or a PMI launcher (OMPI_COMM_WORLD_SIZE,
  // PMI_SIZE or PMIX_RANK is set).
  static bool launched_by_mpirun();

 private:
  bool owns_ = false;
};

// A communicator over a duplicate of MPI_COMM_WORLD (chunk_bytes: kDefaultChunkBytes). Throws
// loom::Error when MPI is not initialized (make an MpiSession first).
std::unique_ptr<Communicator> mpi_world();

// Ends every process of the job with `code` (MPI_Abort on MPI_COMM_WORLD); when MPI is not running,
// ends this process.
[[noreturn]] void mpi_abort(int code);

}  // namespace loom::comm
