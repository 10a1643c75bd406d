// The local backend: every collective against the plain references of comm_checks.h on 1 to 4 ranks
// and at several chunk sizes, split into a 2x2 mesh, the summation order, and failures (a rank that
// throws, returns early, or makes a different call) stopping every rank instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "loom/comm/comm_checks.h"
#include "loom/comm/local.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

using Check = void (*)(Communicator&, const checks::Options&);

// Runs `check` on n = 1..4 ranks at chunk_bytes = default, 12 and 64.
void on_every_world(Check check) {
  for (int n = 1; n <= 4; ++n)
    for (int64_t chunk : {kDefaultChunkBytes, int64_t(12), int64_t(64)}) {
      try {
        run_local(n, [&](Communicator& c) {
          c.set_chunk_bytes(chunk);
          c.set_gather_chunk_bytes(chunk);
          check(c, checks::Options{});
        });
      } catch (const std::exception& e) {
        ADD_FAILURE() << "n = " << n << ", chunk_bytes = " << chunk << ": " << e.what();
      }
    }
}

TEST(LocalComm, AllReduce) { on_every_world(checks::check_all_reduce); }
TEST(LocalComm, ReduceScatter) { on_every_world(checks::check_reduce_scatter); }
TEST(LocalComm, AllGather) { on_every_world(checks::check_all_gather); }
TEST(LocalComm, BroadcastFromEveryRoot) { on_every_world(checks::check_broadcast); }
TEST(LocalComm, AllToAll) { on_every_world(checks::check_all_to_all); }
TEST(LocalComm, SendRecvRing) { on_every_world(checks::check_send_recv_ring); }
TEST(LocalComm, ChunkingGivesTheSameBits) { on_every_world(checks::check_chunking); }
TEST(LocalComm, SplitByParity) { on_every_world(checks::check_split); }

TEST(LocalComm, Mesh2x2RowsAndColumns) {
  for (int64_t chunk : {kDefaultChunkBytes, int64_t(12)})
    EXPECT_NO_THROW(run_local(4,
                              [&](Communicator& c) {
                                c.set_chunk_bytes(chunk);
                                c.set_gather_chunk_bytes(chunk);
                                checks::check_mesh_2x2(c, checks::Options{});
                              }))
        << "chunk_bytes = " << chunk;
}

TEST(LocalComm, BackendAndRanks) {
  run_local(3, [](Communicator& c) {
    EXPECT_EQ(c.backend(), "local");
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.chunk_bytes(), kDefaultChunkBytes);
  });
}

// ((1e8 + 1) - 1e8) = 0 in f32, while (1e8 - 1e8) + 1 = 1: the result shows the order of the sum.
TEST(LocalComm, F32SumsInRankOrder) {
  run_local(3, [](Communicator& c) {
    const float in[3] = {1e8f, 1.f, -1e8f};
    float x = in[c.rank()];
    c.all_reduce(&x, 1, DType::f32);
    EXPECT_EQ(x, 0.f) << "rank " << c.rank();
  });
}

// 1 + 2^-8 + 2^-8 in f32 is 1 + 2^-7, a bf16; rounding after each add would give 1 (ties to even).
TEST(LocalComm, Bf16RoundsOnceAtTheEnd) {
  run_local(3, [](Communicator& c) {
    const float in[3] = {1.f, 0.00390625f, 0.00390625f};
    bf16 x = f32_to_bf16(in[c.rank()]);
    c.all_reduce(&x, 1, DType::bf16);
    EXPECT_EQ(bf16_to_f32(x), 1.0078125f) << "rank " << c.rank();
    const bf16 mine = f32_to_bf16(in[c.rank()]);
    bf16 blocks[3] = {mine, mine, mine}, out;
    c.reduce_scatter(blocks, &out, 1, DType::bf16);
    EXPECT_EQ(bf16_to_f32(out), 1.0078125f) << "rank " << c.rank();
  });
}

TEST(LocalComm, MessagesAreMatchedByPeerAndTag) {
  run_local(3, [](Communicator& c) {
    c.set_chunk_bytes(8);
    if (c.rank() == 0) {
      const char a[] = "first-tag-1", b[] = "second-tag-1", d[] = "tag-2";
      c.send(a, sizeof a, 1, 1);
      c.send(b, sizeof b, 1, 1);
      c.send(d, sizeof d, 1, 2);
    } else if (c.rank() == 2) {
      const char e[] = "from-2";
      c.send(e, sizeof e, 1, 1);
    } else {
      char d[6], e[7], a[12], b[13];
      c.recv(d, sizeof d, 0, 2);  // tag 2 first, though sent last
      c.recv(e, sizeof e, 2, 1);
      c.recv(a, sizeof a, 0, 1);  // same (peer, tag): in the order sent
      c.recv(b, sizeof b, 0, 1);
      EXPECT_STREQ(d, "tag-2");
      EXPECT_STREQ(e, "from-2");
      EXPECT_STREQ(a, "first-tag-1");
      EXPECT_STREQ(b, "second-tag-1");
    }
    c.barrier();
  });
}

TEST(LocalComm, BadArgumentsThrow) {
  EXPECT_THROW(LocalWorld(0), Error);
  LocalWorld w(2);
  EXPECT_THROW(w.communicator(2), Error);
  auto c0 = w.communicator(0);
  EXPECT_THROW(w.communicator(0), Error);
  EXPECT_THROW(c0->set_chunk_bytes(0), Error);
  EXPECT_THROW(c0->set_chunk_bytes(kMaxChunkBytes + 1), Error);
  float x = 0;
  EXPECT_THROW(c0->all_reduce(&x, -1, DType::f32), Error);
  EXPECT_THROW(c0->broadcast(&x, 4, 2), Error);
  EXPECT_THROW(c0->send(&x, 4, -1, 0), Error);
  EXPECT_THROW(c0->send(&x, 4, 1, -3), Error);
  EXPECT_THROW(c0->all_gather(nullptr, &x, 4), Error);
}

TEST(LocalComm, RecvOfTheWrongSizeThrows) {
  EXPECT_THROW(run_local(2,
                         [](Communicator& c) {
                           int64_t x = 0;
                           if (c.rank() == 0)
                             c.send(&x, 8, 1, 0);
                           else
                             c.recv(&x, 4, 0, 0);
                         }),
               Error);
}

// The message of run_local's error for the run, and each rank's own error.
struct Outcome {
  std::string error;
  std::vector<std::string> ranks;
};

Outcome run_failing(int n, const std::function<void(Communicator&)>& fn) {
  Outcome o;
  o.ranks.resize(size_t(n));
  try {
    run_local(n, [&](Communicator& c) {
      try {
        fn(c);
      } catch (const std::exception& e) {
        o.ranks[size_t(c.rank())] = e.what();  // each thread its own element
        throw;
      }
    });
  } catch (const Error& e) {
    o.error = e.what();
  }
  return o;
}

TEST(LocalComm, AThrowingRankAbortsTheOthers) {
  Outcome o = run_failing(4, [](Communicator& c) {
    c.barrier();
    if (c.rank() == 2) throw Error("boom");
    float x[5] = {};
    c.all_reduce(x, 5, DType::f32);  // ranks 0, 1, 3 wait here for rank 2
  });
  EXPECT_EQ(o.error, "rank 2: boom");
  for (int r : {0, 1, 3}) {
    EXPECT_NE(o.ranks[size_t(r)].find(fmt::format("rank {} aborted: rank 2: boom", r)),
              std::string::npos)
        << o.ranks[size_t(r)];
  }
}

TEST(LocalComm, AbortReachesSubCommunicators) {
  Outcome o = run_failing(4, [](Communicator& c) {
    auto rows = c.split(c.rank() / 2, c.rank() % 2);
    if (c.rank() == 3) throw Error("bad batch");
    float x[3] = {};
    rows->all_reduce(x, 3, DType::f32);  // row 0 completes; rank 2 waits for rank 3
    c.barrier();                         // ranks 0 and 1 wait here
  });
  EXPECT_EQ(o.error, "rank 3: bad batch");
  // Rank 3's row communicator is destroyed while its exception unwinds, before run_local aborts the
  // world, so rank 2 may stop first with "rank 3 left ..." (and ranks 0 and 1 then name rank 2's
  // message). Either way every rank stops, naming rank 3.
  for (int r : {0, 1, 2})
    EXPECT_NE(o.ranks[size_t(r)].find("rank 3"), std::string::npos) << o.ranks[size_t(r)];
}

TEST(LocalComm, ARankThatReturnsEarlyDoesNotHangTheOthers) {
  Outcome o = run_failing(3, [](Communicator& c) {
    if (c.rank() == 0) return;
    c.barrier();
  });
  EXPECT_NE(o.error.find("left the communicator"), std::string::npos) << o.error;
}

TEST(LocalComm, RecvFromARankThatLeftThrows) {
  Outcome o = run_failing(2, [](Communicator& c) {
    if (c.rank() == 0) return;
    char b[4];
    c.recv(b, 4, 0, 0);
  });
  EXPECT_NE(o.error.find("rank 1: recv: rank 0 left"), std::string::npos) << o.error;
}

TEST(LocalComm, MismatchedCallsThrowOnEveryRank) {
  Outcome o = run_failing(2, [](Communicator& c) {
    float x[5] = {};
    c.all_reduce(x, 4 + c.rank(), DType::f32);
  });
  EXPECT_NE(o.error.find("collective mismatch: rank 0 called all_reduce(4, f32), rank 1 called "
                         "all_reduce(5, f32)"),
            std::string::npos)
      << o.error;
  for (const std::string& m : o.ranks)
    EXPECT_NE(m.find("collective mismatch"), std::string::npos) << m;
}

TEST(LocalComm, DifferentChunkSizesAreAMismatch) {
  Outcome o = run_failing(2, [](Communicator& c) {
    c.set_chunk_bytes(c.rank() == 0 ? 8 : 16);
    float x[4] = {};
    c.all_reduce(x, 4, DType::f32);
  });
  EXPECT_NE(o.error.find("collective mismatch"), std::string::npos) << o.error;
}

// Without run_local: threads blocked in a barrier and in a recv are released by LocalWorld::abort.
TEST(LocalComm, WorldAbortReleasesBlockedRanks) {
  LocalWorld world(3);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(world.communicator(r));
  std::atomic<int> stopped{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        if (r == 0)
          comms[0]->barrier();
        else {
          char b;
          comms[1]->recv(&b, 1, 2, 0);
        }
      } catch (const Error& e) {
        if (std::string(e.what()) == fmt::format("rank {} aborted: operator stop", r)) ++stopped;
      }
    });
  world.abort("operator stop");
  for (auto& t : threads) t.join();
  EXPECT_EQ(stopped.load(), 2);
  EXPECT_THROW(comms[2]->barrier(), Error);  // later calls throw at once
}

}  // namespace
}  // namespace loom::comm
