// mpi_check: the checks of comm_checks.h over the MPI backend, run under mpirun by CTest
// (comm_mpi_2, comm_mpi_4). Prints "mpi_check: ok (N ranks)" on rank 0 and exits 0, or prints the
// failure with its rank and ends the job with exit code 1 (MPI_Abort: the other ranks may be
// waiting in a collective). Not a skip: started without mpirun, or on fewer than 2 ranks, it fails.
//
// MPI promises no summation order, so the inputs are small integers (exact sums in any order) and
// are compared bit for bit; random f32/bf16 sums are checked to be the same bits on every rank.
#include <cstdio>
#include <memory>

#include "loom/comm/comm_checks.h"
#include "loom/comm/mpi.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

// Random values of many magnitudes: every rank gets the same bits, close to the rank-order sum.
void check_random_sums_agree(Communicator& c) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 1001;
    checks::Bytes buf = checks::values(dt, 1000, c.rank(), 0, n, true);
    c.all_reduce(buf.data(), n, dt);
    checks::expect_same_everywhere(fmt::format("random all_reduce({})", dtype_name(dt)), c, buf);
    const checks::Bytes ref =
        checks::ordered_sum(dt, 1000, checks::all_ranks(c.size()), 0, n, true);
    for (int64_t i = 0; i < n; ++i) {
      auto at = [&](const checks::Bytes& b) {
        if (dt == DType::f32) {
          float f;
          std::memcpy(&f, b.data() + 4 * i, 4);
          return f;
        }
        bf16 h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        return bf16_to_f32(h);
      };
      float mag = 0;
      for (int r = 0; r < c.size(); ++r) mag += std::fabs(checks::value(1000, r, i, true));
      const float tol = float(c.size()) * mag * (dt == DType::f32 ? 1e-6f : 1e-2f);
      if (std::fabs(at(buf) - at(ref)) > tol)
        throw Error(fmt::format(
            "random all_reduce({}): rank {}: element {} is {}, the rank-order sum is {}",
            dtype_name(dt), c.rank(), i, at(buf), at(ref)));
    }
  }
}

// A failing MPI call comes back as loom::Error naming the call and MPI's message (MPI_ERRORS_RETURN
// and the checking wrapper), here a message longer than the receive buffer (MPI_ERR_TRUNCATE).
void check_mpi_errors_are_thrown(Communicator& c) {
  const int64_t sent = 8;
  char buf[8] = {};
  if (c.rank() == 0) c.send(buf, sent, 1, 99);
  if (c.rank() == 1) {
    std::string what;
    try {
      c.recv(buf, 4, 0, 99);
    } catch (const Error& e) {
      what = e.what();
    }
    if (what.find("MPI_Recv failed: ") == std::string::npos ||
        what.find("truncat") == std::string::npos)
      throw Error("a truncated MPI_Recv gave \"" + what +
                  "\", expected loom::Error naming MPI_Recv");
  }
  c.barrier();
}

void run(Communicator& world) {
  if (world.size() < 2)
    throw Error(fmt::format("mpi_check: {} rank", world.size()),
                "run it as mpirun -np 2 (or 4) mpi_check");
  if (world.backend() != "mpi") throw Error("mpi_check: backend is " + world.backend());
  const checks::Options exact{.rank_order = false};
  // blocking calls, then the non-blocking ones a communication thread waits for politely
  // (communicator.h: set_polite_waits; reduce_scatter then runs as an alltoall and a local sum)
  for (bool polite : {false, true}) {
    set_polite_waits(polite);
    for (int64_t chunk : {kDefaultChunkBytes, int64_t(12), int64_t(64)}) {
      world.set_chunk_bytes(chunk);
      world.set_gather_chunk_bytes(chunk == kDefaultChunkBytes ? kMaxChunkBytes : chunk);
      checks::run_all(world, exact);
    }
    world.set_chunk_bytes(kDefaultChunkBytes);
    world.set_gather_chunk_bytes(kMaxChunkBytes);
    checks::check_chunking(world, exact);
    check_random_sums_agree(world);
  }
  set_polite_waits(false);
  world.set_chunk_bytes(kDefaultChunkBytes);
  world.set_gather_chunk_bytes(kMaxChunkBytes);
  checks::check_chunking(world, exact);
  check_random_sums_agree(world);
  check_mpi_errors_are_thrown(world);
  world.barrier();
}

}  // namespace
}  // namespace loom::comm

int main() {
  using namespace loom::comm;
  if (!MpiSession::launched_by_mpirun()) {
    std::fprintf(stderr, "mpi_check: not started by mpirun\nhint: mpirun -np 2 mpi_check\n");
    return 1;
  }
  std::unique_ptr<MpiSession> session;
  try {
    session = std::make_unique<MpiSession>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_check: FAILED: %s\n", e.what());
    return 1;
  }
  int rank = -1, size = 0;
  try {
    std::unique_ptr<Communicator> world = mpi_world();
    rank = world->rank();
    size = world->size();
    run(*world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_check: FAILED on rank %d: %s\n", rank, e.what());
    mpi_abort(1);
  }
  if (rank == 0) std::printf("mpi_check: ok (%d ranks)\n", size);
  return 0;
}
