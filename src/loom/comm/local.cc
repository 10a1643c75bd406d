// The local backend (see local.h for how a step runs and how failures stop every rank).
//
// Locking: one mutex per world guards every group's slots and barrier counters, the mailbox and the
// abort flag; one condition variable per world wakes every waiter, which rechecks its own
// condition. A step's body (the copy or the sum) runs without the lock: between the two barriers
// the slots are read-only, and each rank writes only its own output.
#include "loom/comm/local.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "loom/comm/chunking.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace detail {

// What one rank asked for in one step; every rank of the communicator must ask for the same.
struct LocalCall {
  const char* op = "";
  int64_t total = 0;  // the whole call's count or bytes
  int64_t piece = 0;  // this step's count or bytes
  int dtype = -1;     // reductions only
  int root = -1;      // broadcast only

  bool same_as(const LocalCall& o) const {
    return std::string_view(op) == o.op && total == o.total && piece == o.piece &&
           dtype == o.dtype && root == o.root;
  }
  std::string describe() const {
    std::string s = fmt::format("{}({}", op, total);
    if (piece != total) s += fmt::format(", piece {}", piece);
    if (dtype >= 0) s += fmt::format(", {}", dtype_name(DType(dtype)));
    if (root >= 0) s += fmt::format(", root {}", root);
    return s + ")";
  }
};

struct LocalSlot {
  LocalCall call;
  const void* in = nullptr;
  int color = 0, key = 0;            // split
  std::shared_ptr<LocalGroup> made;  // split: the group its leader created
};

// The state of one communicator, shared by its ranks.
struct LocalGroup {
  LocalGroup(int id, std::vector<int> world_ranks)
      : id(id),
        world_rank(std::move(world_ranks)),
        slots(world_rank.size()),
        attached(world_rank.size()),
        departed(world_rank.size()) {}
  int id;
  std::vector<int> world_rank;  // rank in this group -> rank in the world (for messages)
  std::vector<LocalSlot> slots;
  std::vector<char> attached;  // the world's group: LocalWorld::communicator handed it out
  std::vector<char> departed;  // its Communicator was destroyed
  int arrived = 0;
  uint64_t generation = 0;  // completed barriers
};

struct LocalWorldState {
  std::mutex mu;
  std::condition_variable cv;  // every wait of every group of the world
  bool aborted = false;
  std::string why;
  int next_group_id = 1;
  // (group id, src, dst, tag) -> messages in the order sent
  std::map<std::tuple<int, int, int, int>, std::deque<std::vector<char>>> mailbox;
};

}  // namespace detail

namespace {

using detail::LocalCall;
using detail::LocalGroup;
using detail::LocalSlot;
using detail::LocalWorldState;

// Thrown on a rank stopped because of another rank (an abort, or a rank that left): run_local
// reports the first error of a rank that failed of its own accord before any of these.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

// dst[i] = src_0[i] + src_1[i] + ... + src_{R-1}[i], added in rank order, where src_r is
// slots[r].in advanced by `offset` bytes. bf16 is accumulated in f32 and rounded once; i32 wraps.
// dst must not overlap any source. Does not allocate or throw (it runs between the two barriers of
// a step).
void sum_in_rank_order(const std::vector<LocalSlot>& slots, int64_t offset, int64_t n, DType dt,
                       void* dst) {
  const size_t ranks = slots.size();
  auto src = [&](size_t r) { return static_cast<const char*>(slots[r].in) + offset; };
  switch (dt) {
    case DType::f32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        float acc = reinterpret_cast<const float*>(src(0))[i];
        for (size_t r = 1; r < ranks; ++r) acc += reinterpret_cast<const float*>(src(r))[i];
        d[i] = acc;
      }
      return;
    }
    case DType::bf16: {
      bf16* d = static_cast<bf16*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        float acc = bf16_to_f32(reinterpret_cast<const bf16*>(src(0))[i]);
        for (size_t r = 1; r < ranks; ++r)
          acc += bf16_to_f32(reinterpret_cast<const bf16*>(src(r))[i]);
        d[i] = f32_to_bf16(acc);
      }
      return;
    }
    case DType::i32: {
      int32_t* d = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t acc = uint32_t(reinterpret_cast<const int32_t*>(src(0))[i]);
        for (size_t r = 1; r < ranks; ++r)
          acc += uint32_t(reinterpret_cast<const int32_t*>(src(r))[i]);
        d[i] = int32_t(acc);
      }
      return;
    }
  }
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalWorldState> world, std::shared_ptr<LocalGroup> group,
                    int rank, int64_t chunk_bytes)
      : Communicator(chunk_bytes),
        world_(std::move(world)),
        group_(std::move(group)),
        rank_(rank) {}

  // Leaving is not a collective: it marks this rank gone and wakes whoever waits for it.
  ~LocalCommunicator() override {
    std::lock_guard<std::mutex> lk(world_->mu);
    group_->departed[size_t(rank_)] = 1;
    world_->cv.notify_all();
  }

  int rank() const override { return rank_; }
  int size() const override { return int(group_->world_rank.size()); }
  std::string backend() const override { return "local"; }

 protected:
  void do_all_reduce(void* buf, int64_t count, DType dt) override {
    const int64_t es = int64_t(dtype_size(dt));
    const int64_t max_n = piece_units(es, chunk_bytes());
    std::vector<char> sum(size_t(std::min(count, max_n) * es));
    char* p = static_cast<char*>(buf);
    for_each_piece(count, max_n, [&](int64_t off, int64_t n) {
      LocalSlot s;
      s.call = {"all_reduce", count, n, int(dt), -1};
      s.in = p + off * es;
      step(s, [&](const std::vector<LocalSlot>& slots) {
        sum_in_rank_order(slots, 0, n, dt, sum.data());
      });
      // after the step's second barrier no rank reads buf any more
      std::memcpy(p + off * es, sum.data(), size_t(n * es));
    });
  }

  void do_all_gather(const void* in, void* out, int64_t bytes) override {
    chunked_all_gather(in, out, bytes, size(), gather_chunk_bytes(),
                       [&](const void* pin, void* pout, int64_t n) {
                         LocalSlot s;
                         s.call = {"all_gather", bytes, n};
                         s.in = pin;
                         step(s, [&](const std::vector<LocalSlot>& slots) {
                           for (size_t r = 0; r < slots.size(); ++r)
                             std::memcpy(static_cast<char*>(pout) + r * n, slots[r].in, size_t(n));
                         });
                       });
  }

  void do_reduce_scatter(const void* in, void* out, int64_t count, DType dt) override {
    const int64_t es = int64_t(dtype_size(dt));
    chunked_reduce_scatter(in, out, count, es, size(), chunk_bytes(),
                           [&](const void* pin, void* pout, int64_t n) {
                             LocalSlot s;
                             s.call = {"reduce_scatter", count, n, int(dt), -1};
                             s.in = pin;  // (size, n)
                             step(s, [&](const std::vector<LocalSlot>& slots) {
                               sum_in_rank_order(slots, rank_ * n * es, n, dt, pout);
                             });
                           });
  }

  void do_broadcast(void* buf, int64_t bytes, int root) override {
    char* p = static_cast<char*>(buf);
    for_each_piece(bytes, piece_units(1, chunk_bytes()), [&](int64_t off, int64_t n) {
      LocalSlot s;
      s.call = {"broadcast", bytes, n, -1, root};
      s.in = p + off;
      step(s, [&](const std::vector<LocalSlot>& slots) {
        if (rank_ != root) std::memcpy(p + off, slots[size_t(root)].in, size_t(n));
      });
    });
  }

  void do_all_to_all(const void* in, void* out, int64_t bytes) override {
    chunked_all_to_all(
        in, out, bytes, size(), chunk_bytes(), [&](const void* pin, void* pout, int64_t n) {
          LocalSlot s;
          s.call = {"all_to_all", bytes, n};
          s.in = pin;  // (size, n): block j goes to rank j
          step(s, [&](const std::vector<LocalSlot>& slots) {
            for (size_t i = 0; i < slots.size(); ++i)
              std::memcpy(static_cast<char*>(pout) + i * n,
                          static_cast<const char*>(slots[i].in) + rank_ * n, size_t(n));
          });
        });
  }

  void do_send(const void* buf, int64_t bytes, int peer, int tag) override {
    const char* p = static_cast<const char*>(buf);
    for_each_piece(bytes, piece_units(1, chunk_bytes()), [&](int64_t off, int64_t n) {
      std::vector<char> msg(p + off, p + off + n);
      std::lock_guard<std::mutex> lk(world_->mu);
      throw_if_stopped("send", peer);
      world_->mailbox[{group_->id, rank_, peer, tag}].push_back(std::move(msg));
      world_->cv.notify_all();
    });
  }

  void do_recv(void* buf, int64_t bytes, int peer, int tag) override {
    char* p = static_cast<char*>(buf);
    const auto key = std::make_tuple(group_->id, peer, rank_, tag);
    for_each_piece(bytes, piece_units(1, chunk_bytes()), [&](int64_t off, int64_t n) {
      std::unique_lock<std::mutex> lk(world_->mu);
      auto& box = world_->mailbox;
      world_->cv.wait(lk, [&] {
        auto it = box.find(key);
        return (it != box.end() && !it->second.empty()) || stopped(peer);
      });
      auto it = box.find(key);
      if (it == box.end() || it->second.empty()) throw_if_stopped("recv", peer);
      std::vector<char> msg = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) box.erase(it);
      lk.unlock();
      if (int64_t(msg.size()) != n)
        throw Error(
            fmt::format("recv: rank {} sent a piece of {} bytes with tag {}, this recv of {} bytes "
                        "expects {}",
                        world_rank(peer), msg.size(), tag, bytes, n),
            "send and recv must agree on bytes and chunk_bytes");
      std::memcpy(p + off, msg.data(), size_t(n));
    });
  }

 public:
  void barrier() override {
    LocalSlot s;
    s.call = {"barrier"};
    step(s, [](const std::vector<LocalSlot>&) {});
  }

  // Three barriers: everyone's (color, key) is published; each color's leader (its lowest old rank)
  // has created the new group; everyone has taken its group from its leader's slot.
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_lock<std::mutex> lk(world_->mu);
    std::vector<LocalSlot>& slots = group_->slots;
    LocalSlot mine;
    mine.call = {"split"};
    mine.color = color;
    mine.key = key;
    slots[size_t(rank_)] = mine;
    wait_all(lk, "split", true);
    const std::string bad = mismatch();
    std::vector<int> members;  // old ranks of my color, ordered by (key, old rank)
    if (bad.empty() && color >= 0) {
      for (int r = 0; r < size(); ++r)
        if (slots[size_t(r)].color == color) members.push_back(r);
      if (members.front() == rank_) {
        std::vector<int> world_ranks;
        std::vector<int> by_key = members;
        std::stable_sort(by_key.begin(), by_key.end(),
                         [&](int a, int b) { return slots[size_t(a)].key < slots[size_t(b)].key; });
        for (int r : by_key) world_ranks.push_back(group_->world_rank[size_t(r)]);
        slots[size_t(rank_)].made =
            std::make_shared<LocalGroup>(world_->next_group_id++, world_ranks);
      }
    }
    wait_all(lk, "split", false);
    std::shared_ptr<LocalGroup> made;
    if (bad.empty() && color >= 0) made = slots[size_t(members.front())].made;
    wait_all(lk, "split", false);
    slots[size_t(rank_)].made.reset();
    if (!bad.empty()) throw Error(bad);
    if (!made) return nullptr;
    const int me = world_rank(rank_);
    const int new_rank = int(std::find(made->world_rank.begin(), made->world_rank.end(), me) -
                             made->world_rank.begin());
    lk.unlock();
    auto sub = std::make_unique<LocalCommunicator>(world_, made, new_rank, chunk_bytes());
    sub->set_gather_chunk_bytes(gather_chunk_bytes());
    return sub;
  }

 private:
  int world_rank(int r) const { return group_->world_rank[size_t(r)]; }

  // (lock held) Whether this rank must stop waiting: the world was aborted, or `peer` (every member
  // when peer < 0) left the communicator.
  bool stopped(int peer = -1) const {
    if (world_->aborted) return true;
    for (int r = 0; r < size(); ++r)
      if (r != rank_ && (peer < 0 || r == peer) && group_->departed[size_t(r)]) return true;
    return false;
  }

  // (lock held) Throws PeerFailure if stopped(peer).
  void throw_if_stopped(const char* op, int peer = -1) const {
    if (world_->aborted)
      throw PeerFailure(fmt::format("rank {} aborted: {}", world_rank(rank_), world_->why));
    for (int r = 0; r < size(); ++r)
      if (r != rank_ && (peer < 0 || r == peer) && group_->departed[size_t(r)])
        throw PeerFailure(
            fmt::format("{}: rank {} left the communicator (destroyed it) while rank {} "
                        "still needs it",
                        op, world_rank(r), world_rank(rank_)),
            "the ranks made different calls, or one rank returned early");
  }

  // (lock held) Waits until every rank of the group has arrived. An abortable wait throws instead
  // once the world is aborted or a member left, unless the barrier completed first: so either every
  // rank passes a barrier or none does. A wait that is not abortable is used only where every rank
  // is known to arrive (after the first barrier of a step), so that no rank returns while another
  // still reads its buffers.
  void wait_all(std::unique_lock<std::mutex>& lk, const char* op, bool abortable) {
    LocalGroup& g = *group_;
    if (abortable) throw_if_stopped(op);
    const uint64_t gen = g.generation;
    if (++g.arrived == size()) {
      g.arrived = 0;
      ++g.generation;
      world_->cv.notify_all();
      return;
    }
    world_->cv.wait(lk, [&] { return g.generation != gen || (abortable && stopped()); });
    if (g.generation != gen) return;
    --g.arrived;
    throw_if_stopped(op);
  }

  // (lock held, after the first barrier) "" when every rank made the same call, else the message.
  std::string mismatch() const {
    const std::vector<LocalSlot>& slots = group_->slots;
    bool same = true;
    for (const LocalSlot& s : slots) same = same && s.call.same_as(slots[0].call);
    if (same) return "";
    std::string msg = "collective mismatch:";
    for (size_t r = 0; r < slots.size(); ++r)
      msg += fmt::format(" rank {} called {}{}", world_rank(int(r)), slots[r].call.describe(),
                         r + 1 < slots.size() ? "," : "");
    return msg +
           "\nhint: every rank must make the same calls in the same order, with the same sizes "
           "and chunk_bytes";
  }

  // One step of a collective: publish `mine`, wait for every rank, check they all made the same
  // call, run body (reads the slots, writes only this rank's output; must not throw), wait again.
  void step(const LocalSlot& mine, const std::function<void(const std::vector<LocalSlot>&)>& body) {
    std::unique_lock<std::mutex> lk(world_->mu);
    group_->slots[size_t(rank_)] = mine;
    wait_all(lk, mine.call.op, true);
    const std::string bad = mismatch();
    lk.unlock();
    if (bad.empty()) body(group_->slots);
    lk.lock();
    wait_all(lk, mine.call.op, false);
    if (!bad.empty()) throw Error(bad);
  }

  std::shared_ptr<LocalWorldState> world_;
  std::shared_ptr<LocalGroup> group_;
  int rank_;
};

}  // namespace

LocalWorld::LocalWorld(int n) {
  if (n < 1) throw Error(fmt::format("LocalWorld: {} ranks", n), "a world has at least 1 rank");
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) ranks[size_t(r)] = r;
  world_ = std::make_shared<LocalWorldState>();
  root_ = std::make_shared<LocalGroup>(0, std::move(ranks));
}

LocalWorld::~LocalWorld() = default;

int LocalWorld::size() const { return int(root_->world_rank.size()); }

std::unique_ptr<Communicator> LocalWorld::communicator(int rank) {
  if (rank < 0 || rank >= size())
    throw Error(fmt::format("LocalWorld::communicator({}): not a rank of this {}-rank world", rank,
                            size()));
  std::lock_guard<std::mutex> lk(world_->mu);
  if (root_->attached[size_t(rank)])
    throw Error(fmt::format("LocalWorld::communicator({}): already handed out", rank),
                "each rank has one communicator; split it for sub-groups");
  root_->attached[size_t(rank)] = 1;
  return std::make_unique<LocalCommunicator>(world_, root_, rank, kDefaultChunkBytes);
}

void LocalWorld::abort(const std::string& why) {
  std::lock_guard<std::mutex> lk(world_->mu);
  if (!world_->aborted) {
    world_->aborted = true;
    world_->why = why;
  }
  world_->cv.notify_all();
}

void run_local(int n, const std::function<void(Communicator&)>& fn) {
  LocalWorld world(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(world.communicator(r));
  std::mutex mu;
  std::string first, first_stopped;  // the first error of a rank that failed itself / was stopped
  auto fail = [&](int r, const std::string& what, bool stopped) {
    const std::string msg = fmt::format("rank {}: {}", r, what);
    {
      std::lock_guard<std::mutex> lk(mu);
      std::string& slot = stopped ? first_stopped : first;
      if (slot.empty()) slot = msg;
    }
    world.abort(msg);
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int r = 0; r < n; ++r) {
    try {
      threads.emplace_back([&fn, &fail, r, comm = std::move(comms[size_t(r)])]() mutable {
        try {
          fn(*comm);
        } catch (const PeerFailure& e) {
          fail(r, e.what(), true);
        } catch (const std::exception& e) {
          fail(r, e.what(), false);
        } catch (...) {
          fail(r, "unknown exception", false);
        }
        comm.reset();  // leave: a rank still waiting for this one stops instead of hanging
      });
    } catch (const std::exception& e) {
      fail(r, std::string("cannot start its thread: ") + e.what(), false);
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  if (!first.empty()) throw Error(first);
  if (!first_stopped.empty()) throw Error(first_stopped);
}

}  // namespace loom::comm
