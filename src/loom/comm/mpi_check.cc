// mpi_check: the checks of comm_checks.h over the MPI backend, run under mpirun by CTest
// (comm_mpi_2, comm_mpi_4). Prints "mpi_check: ok (N ranks)" on rank 0 and exits 0, or prints the
// failure with its rank and ends the job with exit code 1 (MPI_Abort: the other ranks may be
// waiting in a collective). Not a skip: started without mpirun, or on fewer than 2 ranks, it fails.
//
// MPI promises no summation order, so the inputs are small integers (exact sums in any order) and
// are compared bit for bit; random f32/bf16 sums are checked to be the same bits on every rank.
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

// A rank's two communication streams, its host's and the network's, run collectives on two
// communicators at once (runtime/executor.h): MPI_THREAD_MULTIPLE (MpiSession asks for it), and
// two threads each summing on their own communicator, interleaved, get exact sums.
void check_two_groups_at_once(Communicator& world) {
  if (!world.concurrent_groups())
    throw Error("mpi_check: MPI does not provide MPI_THREAD_MULTIPLE",
                "a rank's axes then share one communication thread; use an MPI built with it");
  std::unique_ptr<Communicator> all = world.split(0, world.rank());
  std::unique_ptr<Communicator> pairs = world.split(world.rank() / 2, world.rank());
  std::string failed;
  std::mutex mu;
  auto sums = [&](Communicator& c, int scale) {
    try {
      set_polite_waits(true);
      const int m = c.size();
      for (int i = 0; i < 50; ++i) {
        std::vector<int32_t> v(257, (c.rank() + 1) * scale + i);
        c.all_reduce(v.data(), int64_t(v.size()), DType::i32);
        const int32_t want = scale * m * (m + 1) / 2 + i * m;
        for (int32_t x : v)
          if (x != want)
            throw Error(fmt::format("sum {} over {} ranks is {}, want {}", i, m, x, want));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(mu);
      failed += e.what();
    }
  };
  std::thread a([&] { sums(*all, 1); });
  std::thread b([&] { sums(*pairs, 1000); });
  a.join();
  b.join();
  if (!failed.empty())
    throw Error(fmt::format("two communicators at once, rank {}: {}", world.rank(), failed));
  world.barrier();
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
  check_two_groups_at_once(world);
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
