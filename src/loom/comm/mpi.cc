// The MPI backend (see mpi.h). Every MPI call is written LOOM_MPI(MPI_Xxx, args...), which passes
// the return code and the call's name to mpi_call, the one place that turns a failure into
// loom::Error. Not here: choosing algorithms (Open MPI's tuned module does, but for the polite
// all_reduce, a ring of point-to-point messages: ring_all_reduce), averaging, device buffers.
// Invariant: no MPI count exceeds INT_MAX, because every call moves one piece of at most
// chunk_bytes (<= kMaxChunkBytes = 1 GiB) per rank.
#include "loom/comm/mpi.h"

#include <fmt/format.h>
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/chunking.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {

// The checking wrapper: throws loom::Error("MPI_Xxx failed: <MPI's error string>").
void mpi_call(const char* name, int rc) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    len = std::snprintf(text, sizeof text, "MPI error code %d", rc);
  throw Error(fmt::format("{} failed: {}", name, std::string(text, size_t(len))),
              "an MPI failure on one rank ends the job: see the other ranks' output too");
}

#define LOOM_MPI(fn, ...) mpi_call(#fn, fn(__VA_ARGS__))

// Calls `release` where a destructor must not throw: a failure is printed, not thrown.
template <class F>
void release_quietly(F&& release) {
  try {
    release();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: %s\n", e.what());
  }
}

// kDefaultChunkBytes and room for ob1's match header (docs/comm.md: Open MPI's TCP settings)
constexpr int64_t kTcpEagerLimit = kDefaultChunkBytes + 4096;

bool mpi_running() {
  int init = 0, fin = 0;
  LOOM_MPI(MPI_Initialized, &init);
  LOOM_MPI(MPI_Finalized, &fin);
  return init && !fin;
}

// Runs a collective: blocking (`call`, MPI's own wait polls flat out), or, on a thread that asked
// for polite waits (communicator.h), non-blocking (`start`) completed by MPI_Test with sleeps
// between polls: 64 polls first (a small collective ends within them), then sleeps of 10 us
// doubling to 100 us (a 1 ms cap left the link idle: bench-llama fsdp at 0.5 Gbit/s, 328 against
// 349 tokens/s).
// Over TCP the socket buffers keep the link busy while this thread sleeps; Open MPI progresses the
// collective inside each MPI_Test.
// While a thread waits for this one (communicator.h: hurried), it polls without sleeping, yielding
// its core to any other thread ready to run on it (ranks that share cores).
void pause_between_polls(long& ns) {
  if (hurried()) {
    std::this_thread::yield();
    return;
  }
  const timespec ts{0, ns};
  nanosleep(&ts, nullptr);
  ns = std::min(2 * ns, 100000L);
}

// Completes `n` requests (their statuses into `st`, if given): 64 polls, then polls with pauses
// between them.
void wait_politely(MPI_Request* reqs, int n, MPI_Status* st = MPI_STATUSES_IGNORE) {
  int done = 0;
  for (int i = 0; i < 64 && !done; ++i) LOOM_MPI(MPI_Testall, n, reqs, &done, st);
  for (long ns = 10000; !done;) {
    pause_between_polls(ns);
    LOOM_MPI(MPI_Testall, n, reqs, &done, st);
  }
}

template <class Start>
void complete_politely(const char* name, Start&& start) {
  MPI_Request req = MPI_REQUEST_NULL;
  mpi_call(name, start(&req));
  wait_politely(&req, 1);
}

template <class Blocking, class Start>
void collective(const char* name, Blocking&& call, Start&& start) {
  if (polite_waits())
    complete_politely(name, start);
  else
    mpi_call(name, call());
}

int to_int(int64_t n) {
  LOOM_CHECK(n >= 0 && n <= INT_MAX) << "an MPI count of " << n << " (pieces are <= chunk_bytes)";
  return int(n);
}

// The bf16 sum as an MPI_Op: inout[i] = bf16(f32(in[i]) + f32(inout[i])), round to nearest even.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
  }
  return MPI_DATATYPE_NULL;
}

// Owns an MPI communicator handle. MPI_Comm_free is collective in name only: it marks the handle
// for deallocation and returns without waiting for the other ranks, so it is safe in a destructor.
struct CommHandle {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit CommHandle(MPI_Comm c) : comm(c) {}
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle() {
    release_quietly([&] {
      if (comm != MPI_COMM_NULL && mpi_running()) LOOM_MPI(MPI_Comm_free, &comm);
    });
  }
};

// Owns the bf16 sum MPI_Op (one per communicator: no global state).
struct OpHandle {
  MPI_Op op = MPI_OP_NULL;
  OpHandle() { LOOM_MPI(MPI_Op_create, &bf16_sum, /*commute=*/1, &op); }
  OpHandle(const OpHandle&) = delete;
  OpHandle& operator=(const OpHandle&) = delete;
  ~OpHandle() {
    release_quietly([&] {
      if (op != MPI_OP_NULL && mpi_running()) LOOM_MPI(MPI_Op_free, &op);
    });
  }
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`.
  MpiCommunicator(MPI_Comm comm, int64_t chunk_bytes) : Communicator(chunk_bytes), comm_(comm) {
    LOOM_MPI(MPI_Comm_set_errhandler, comm_.comm, MPI_ERRORS_RETURN);
    // the ring's own context: its messages never match a send/recv of the communicator
    LOOM_MPI(MPI_Comm_dup, comm_.comm, &ring_.comm);
    LOOM_MPI(MPI_Comm_set_errhandler, ring_.comm, MPI_ERRORS_RETURN);
    LOOM_MPI(MPI_Comm_rank, comm_.comm, &rank_);
    LOOM_MPI(MPI_Comm_size, comm_.comm, &size_);
    int* ub = nullptr;
    int flag = 0;
    LOOM_MPI(MPI_Comm_get_attr, comm_.comm, MPI_TAG_UB, &ub, &flag);
    tag_ub_ = flag && ub ? *ub : 32767;  // the standard's minimum
    // collective, as making the communicator is: how many of its ranks are on this rank's host
    // (its processor name; MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) hung Open MPI 4.1 over TCP
    // between network namespaces, two ranks a namespace)? Fewer than all: it spans hosts.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    LOOM_MPI(MPI_Get_processor_name, name, &len);
    std::vector<char> names(size_t(size_) * MPI_MAX_PROCESSOR_NAME);
    LOOM_MPI(MPI_Allgather, name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
             MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm_.comm);
    for (int r = 0; r < size_; ++r)
      host_ranks_ += std::strncmp(name, names.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME,
                                  MPI_MAX_PROCESSOR_NAME) == 0;
  }

  ~MpiCommunicator() override {
    release_quietly([&] {
      if (mpi_running()) reap_sends(true);
    });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  bool spans_hosts() const override { return host_ranks_ < size_; }
  int host_ranks() const override { return host_ranks_; }
  bool concurrent_groups() const override {
    int provided = 0;
    LOOM_MPI(MPI_Query_thread, &provided);
    return provided >= MPI_THREAD_MULTIPLE;
  }

 protected:
  void do_all_reduce(void* buf, int64_t count, DType dt) override {
    const int64_t es = int64_t(dtype_size(dt));
    char* p = static_cast<char*>(buf);
    for_each_piece(count, piece_units(es, chunk_bytes()), [&](int64_t off, int64_t n) {
      if (polite_waits())
        ring_all_reduce(p + off * es, n, dt);
      else
        LOOM_MPI(MPI_Allreduce, MPI_IN_PLACE, p + off * es, to_int(n), mpi_type(dt), sum_op(dt),
                 comm_.comm);
    });
  }

  void do_all_gather(const void* in, void* out, int64_t bytes) override {
    // across hosts a piece stays within TCP's eager limit (MpiSession), as the reductions' do
    const int64_t piece =
        spans_hosts() ? std::min(gather_chunk_bytes(), chunk_bytes()) : gather_chunk_bytes();
    chunked_all_gather(in, out, bytes, size_, piece, [&](const void* pin, void* pout, int64_t n) {
      collective(
          "MPI_Allgather",
          [&] {
            return MPI_Allgather(pin, to_int(n), MPI_BYTE, pout, to_int(n), MPI_BYTE, comm_.comm);
          },
          [&](MPI_Request* r) {
            return MPI_Iallgather(pin, to_int(n), MPI_BYTE, pout, to_int(n), MPI_BYTE, comm_.comm,
                                  r);
          });
    });
  }

  void do_reduce_scatter(const void* in, void* out, int64_t count, DType dt) override {
    const int64_t es = int64_t(dtype_size(dt));
    if (polite_waits()) {
      // libnbc's MPI_Ireduce_scatter_block reduces to one rank and scatters (over TCP at 0.5
      // Gbit/s, 16 MiB: 383 ms against 147 for the blocking recursive halving), so the polite
      // path exchanges the blocks with MPI_Ialltoall (each rank sends (p-1)/p of its input, as
      // halving does) and sums its p blocks in rank order with MPI_Reduce_local
      std::vector<char> blocks;
      chunked_reduce_scatter(in, out, count, es, size_, chunk_bytes(),
                             [&](const void* pin, void* pout, int64_t n) {
                               blocks.resize(size_t(n * es * size_));
                               complete_politely("MPI_Ialltoall", [&](MPI_Request* r) {
                                 return MPI_Ialltoall(pin, to_int(n), mpi_type(dt), blocks.data(),
                                                      to_int(n), mpi_type(dt), comm_.comm, r);
                               });
                               std::memcpy(pout, blocks.data(), size_t(n * es));
                               for (int r = 1; r < size_; ++r)
                                 LOOM_MPI(MPI_Reduce_local, blocks.data() + r * n * es, pout,
                                          to_int(n), mpi_type(dt), sum_op(dt));
                             });
      return;
    }
    chunked_reduce_scatter(in, out, count, es, size_, chunk_bytes(),
                           [&](const void* pin, void* pout, int64_t n) {
                             LOOM_MPI(MPI_Reduce_scatter_block, pin, pout, to_int(n), mpi_type(dt),
                                      sum_op(dt), comm_.comm);
                           });
  }

  void do_broadcast(void* buf, int64_t bytes, int root) override {
    char* p = static_cast<char*>(buf);
    for_each_piece(bytes, piece_units(1, chunk_bytes()), [&](int64_t off, int64_t n) {
      LOOM_MPI(MPI_Bcast, p + off, to_int(n), MPI_BYTE, root, comm_.comm);
    });
  }

  void do_all_to_all(const void* in, void* out, int64_t bytes) override {
    chunked_all_to_all(
        in, out, bytes, size_, chunk_bytes(), [&](const void* pin, void* pout, int64_t n) {
          LOOM_MPI(MPI_Alltoall, pin, to_int(n), MPI_BYTE, pout, to_int(n), MPI_BYTE, comm_.comm);
        });
  }

  // Buffered: each piece is copied and sent non-blocking, so a send never waits for its recv
  // (pipeline stages send in both directions in one schedule: blocking sends under MPI's
  // rendezvous protocol would deadlock). Completed sends are dropped on later calls; the
  // destructor waits for the rest.
  void do_send(const void* buf, int64_t bytes, int peer, int tag) override {
    check_tag_bound("send", tag);
    reap_sends(false);
    const char* p = static_cast<const char*>(buf);
    for_each_piece(bytes, piece_units(1, chunk_bytes()), [&](int64_t off, int64_t n) {
      sends_.push_back({std::vector<char>(p + off, p + off + n), MPI_REQUEST_NULL});
      Pending& s = sends_.back();
      LOOM_MPI(MPI_Isend, s.data.data(), to_int(n), MPI_BYTE, peer, tag, comm_.comm, &s.req);
    });
  }

  void do_recv(void* buf, int64_t bytes, int peer, int tag) override {
    check_tag_bound("recv", tag);
    char* p = static_cast<char*>(buf);
    for_each_piece(bytes, piece_units(1, chunk_bytes()), [&](int64_t off, int64_t n) {
      MPI_Status st;
      if (polite_waits()) {  // complete_politely, keeping the status
        MPI_Request req = MPI_REQUEST_NULL;
        LOOM_MPI(MPI_Irecv, p + off, to_int(n), MPI_BYTE, peer, tag, comm_.comm, &req);
        wait_politely(&req, 1, &st);
      } else {
        LOOM_MPI(MPI_Recv, p + off, to_int(n), MPI_BYTE, peer, tag, comm_.comm, &st);
      }
      int got = 0;
      LOOM_MPI(MPI_Get_count, &st, MPI_BYTE, &got);
      if (got != n)
        throw Error(
            fmt::format("recv: rank {} sent a piece of {} bytes with tag {}, this recv of {} "
                        "bytes expects {}",
                        peer, got, tag, bytes, n),
            "send and recv must agree on bytes and chunk_bytes");
    });
  }

 public:
  void barrier() override { LOOM_MPI(MPI_Barrier, comm_.comm); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    LOOM_MPI(MPI_Comm_split, comm_.comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (sub == MPI_COMM_NULL) return nullptr;
    auto made = std::make_unique<MpiCommunicator>(sub, chunk_bytes());
    made->set_gather_chunk_bytes(gather_chunk_bytes());
    return made;
  }

 private:
  MPI_Op sum_op(DType dt) const { return dt == DType::bf16 ? bf16_sum_.op : MPI_SUM; }

  // The polite all_reduce of `n` elements at `p`: a ring (each rank sends 2 (P-1)/P of the buffer
  // to its right neighbour and receives as much from its left: a ring over ranks in host order
  // crosses each host's link twice), reduce-scatter then all-gather, each of the 2 (P-1) steps one
  // block sent and one received on ring_, waited politely. Not MPI_Iallreduce: with MPI_IN_PLACE
  // Open MPI's libnbc always takes its binomial tree, reducing the whole buffer to rank 0 and
  // broadcasting it back (over TCP between two hosts, each direction carries the buffer in turn:
  // twice the ring's time; 2 ranks on one host, 4 MiB: docs/comm.md). Block b's sum starts at rank
  // b and adds each next rank's input in ring order, the same bits on every rank.
  void ring_all_reduce(char* p, int64_t n, DType dt) {
    const int P = size_;
    if (P == 1) return;
    const int64_t es = int64_t(dtype_size(dt));
    auto begin = [&](int64_t b) { return b * (n / P) + std::min<int64_t>(b, n % P); };
    auto block = [&](int64_t b) {
      b = ((b % P) + P) % P;
      return std::pair{begin(b), begin(b + 1) - begin(b)};
    };
    const int right = (rank_ + 1) % P, left = (rank_ + P - 1) % P;
    // one received block, kept between calls (a piece's block is at most chunk_bytes / P)
    std::vector<char>& in = ring_in_;
    if (in.size() < size_t((n / P + 1) * es)) in.resize(size_t((n / P + 1) * es));
    auto exchange = [&](int64_t send_block, char* recv_to, int64_t recv_block) {
      const auto [so, sn] = block(send_block);
      const int64_t rn = block(recv_block).second;
      MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      LOOM_MPI(MPI_Irecv, recv_to, to_int(rn), mpi_type(dt), left, 0, ring_.comm, &reqs[0]);
      LOOM_MPI(MPI_Isend, p + so * es, to_int(sn), mpi_type(dt), right, 0, ring_.comm, &reqs[1]);
      wait_politely(reqs, 2);
      return rn;
    };
    for (int s = 0; s < P - 1; ++s) {  // reduce-scatter: block rank-s-1 gains the left's sum
      const int64_t got = exchange(rank_ - s, in.data(), rank_ - s - 1);
      LOOM_MPI(MPI_Reduce_local, in.data(), p + block(rank_ - s - 1).first * es, to_int(got),
               mpi_type(dt), sum_op(dt));
    }
    for (int s = 0; s < P - 1; ++s)  // all-gather: this rank's whole block rank+1 goes round
      exchange(rank_ + 1 - s, p + block(rank_ - s).first * es, rank_ - s);
  }

  // MPI's own limit on tags, beyond the base class's checks
  void check_tag_bound(const char* op, int tag) const {
    if (tag > tag_ub_)
      throw Error(fmt::format("{}: tag {} is over MPI_TAG_UB = {}", op, tag, tag_ub_));
  }

  struct Pending {
    std::vector<char> data;
    MPI_Request req;
  };
  // Drops the buffered sends that completed (all: waits for each).
  void reap_sends(bool all) {
    std::erase_if(sends_, [&](Pending& s) {
      int done = 0;
      if (all)
        LOOM_MPI(MPI_Wait, &s.req, MPI_STATUS_IGNORE), done = 1;
      else
        LOOM_MPI(MPI_Test, &s.req, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
  }

  CommHandle comm_;
  CommHandle ring_{MPI_COMM_NULL};  // a duplicate of comm_ for ring_all_reduce's messages
  std::vector<char> ring_in_;       // ring_all_reduce's received block
  OpHandle bf16_sum_;
  std::list<Pending> sends_;  // buffered sends not known complete
  int rank_ = 0, size_ = 0, tag_ub_ = 0;
  int host_ranks_ = 0;  // its ranks on this rank's host (processor name)
};

}  // namespace

MpiSession::MpiSession() {
  int init = 0, provided = 0;
  LOOM_MPI(MPI_Initialized, &init);
  if (init) {
    LOOM_MPI(MPI_Query_thread, &provided);
  } else {
    // Open MPI's tuning, each measured (docs/comm.md); a user's own setting of a key wins.
    // Its blocking calls poll; on the communication thread a poll that never yields takes a core
    // from the rank's own compute (bench-llama fsdp, 2 ranks on 2 cores: 1011 tokens/s yielding,
    // 970 not).
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    // Reduce_scatter_block by recursive halving: the fixed rules pick an algorithm that moves
    // the whole buffer to one rank and back (over TCP at 0.5 Gbit/s, 2 ranks, 16 MiB: 354 ms
    // against 145 ms, the link's rate; on shared memory the two are within noise). The other
    // collectives keep the fixed rules (dynamic rules with no algorithm forced fall back to them).
    setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 0);
    setenv("OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm", "3", 0);
    // Over TCP, a message of one piece (kDefaultChunkBytes; all_gather's too, where the
    // communicator spans hosts) goes eagerly, without the rendezvous handshake: ob1 sends the
    // handshake's reply on the same connection as the data, so where one rank of a pair enters a
    // collective first, the reply it owes the later rank waits behind its own bulk data in the
    // socket's and the qdisc's queues (up to tcp_limit_output_bytes, 4 MiB) and the two
    // directions of the exchange take turns instead of overlapping. fsdp on 2 ranks over a
    // 1 Gbit/s link (bench/overlap_bench.sh, the Zen 5 host): the prefetched all_gathers beside
    // compute moved at half the link's rate, one direction at a time (docs/benchmarks.md).
    const std::string eager = std::to_string(kTcpEagerLimit);
    for (const char* key : {"OMPI_MCA_btl_tcp_eager_limit", "OMPI_MCA_btl_tcp_rndv_eager_limit",
                            "OMPI_MCA_btl_tcp_max_send_size"})
      setenv(key, eager.c_str(), 0);
    // MULTIPLE: a rank's collectives within its host and across hosts run at once, each on its
    // communication thread (runtime/executor.h); SERIALIZED suffices for one thread at a time
    LOOM_MPI(MPI_Init_thread, nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    owns_ = true;
  }
  // at least SERIALIZED: a rank's collectives run on a communication thread while it computes
  // (runtime/comm_stream.h); below MULTIPLE one thread runs every axis's (concurrent_groups)
  if (provided < MPI_THREAD_SERIALIZED) {
    if (owns_) LOOM_MPI(MPI_Finalize);
    throw Error(
        fmt::format("MPI provides thread level {}, Loom needs MPI_THREAD_SERIALIZED ({})", provided,
                    int(MPI_THREAD_SERIALIZED)),
        "initialize MPI with MPI_Init_thread(MPI_THREAD_SERIALIZED) or let MpiSession do it");
  }
  LOOM_MPI(MPI_Comm_set_errhandler, MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  release_quietly([] {
    if (mpi_running()) LOOM_MPI(MPI_Finalize);
  });
}

bool MpiSession::launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::unique_ptr<Communicator> mpi_world() {
  if (!mpi_running())
    throw Error("mpi_world: MPI is not running",
                "create a loom::comm::MpiSession first and keep it alive");
  MPI_Comm dup = MPI_COMM_NULL;
  LOOM_MPI(MPI_Comm_dup, MPI_COMM_WORLD, &dup);
  return std::make_unique<MpiCommunicator>(dup, kDefaultChunkBytes);
}

void mpi_abort(int code) {
  std::fflush(nullptr);
  release_quietly([&] {
    if (mpi_running()) LOOM_MPI(MPI_Abort, MPI_COMM_WORLD, code);
  });
  std::_Exit(code);
}

}  // namespace loom::comm
