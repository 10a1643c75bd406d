// Collective throughput of the mpi communicator, one JSON line per (op, size, chunking):
//
//   mpirun -np 2 build/release/bench/comm_bench [--reps 20] [--polite]
//
// For f32 payloads of 1 to 64 MiB, all_reduce, reduce_scatter and all_gather, each in 4 MiB pieces
// and in one call (chunk_bytes and gather_chunk_bytes both 4 MiB, then both 1 GiB). Bandwidth is
// the payload over the median time of --reps runs after 3 warm-up runs (payload: the buffer for
// all_reduce, the whole input for reduce_scatter, the whole output for all_gather). It is the
// measurement behind communicator.h's defaults (reductions in 4 MiB pieces, all_gather in one call;
// docs/comm.md). Timings are never asserted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/comm/mpi.h"

using namespace loom;

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  // --polite: wait as a communication thread does (communicator.h: non-blocking calls, sleeps)
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--polite") == 0) comm::set_polite_waits(true);
  comm::MpiSession session;
  auto world = comm::mpi_world();
  const int p = world->size();
  for (int64_t mib : {1, 4, 8, 16, 64}) {
    const int64_t bytes = mib << 20, count = bytes / 4;
    std::vector<float> in(size_t(count), 1.0f), out(size_t(count) * size_t(p), 0.0f);
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
      for (int64_t chunk : {comm::kDefaultChunkBytes, comm::kMaxChunkBytes}) {
        world->set_chunk_bytes(chunk);
        world->set_gather_chunk_bytes(chunk);
        std::vector<double> ts;
        for (int r = 0; r < reps + 3; ++r) {
          world->barrier();
          auto t0 = std::chrono::steady_clock::now();
          if (std::strcmp(op, "all_reduce") == 0)
            world->all_reduce(in.data(), count, DType::f32);
          else if (std::strcmp(op, "reduce_scatter") == 0)
            world->reduce_scatter(in.data(), out.data(), count / p, DType::f32);
          else
            world->all_gather(in.data(), out.data(), bytes / p);
          double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r >= 3) ts.push_back(t);
        }
        std::sort(ts.begin(), ts.end());
        const double median = ts[ts.size() / 2];
        if (world->rank() == 0)
          std::printf(
              "{\"op\": \"%s\", \"ranks\": %d, \"payload_mib\": %lld, \"chunk_mib\": %lld, "
              "\"median_ms\": %.3f, \"gb_per_s\": %.3f}\n",
              op, p, (long long)mib, (long long)(chunk >> 20), median * 1e3,
              double(bytes) / median / 1e9);
      }
    }
  }
  return 0;
}
