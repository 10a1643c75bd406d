// An island's side of the outer loop, driven by `loom train` when [outer] server is set.
//
// On construction it joins the server and replaces the local parameters with the global ones (so
// every island starts from the same weights). The training loop calls sync() whenever
// inner_steps() steps have passed since the last call: the island pushes a pseudo-gradient
// (global - local) when one is due, in sync mode waits for the round to close, and pulls the new
// global parameters into the ParamStore. The inner optimizer state never leaves the island. A
// heartbeat thread keeps the lease alive, also while the island waits.
//
// Streaming DiLoCo ([outer] fragments = F > 1, fragments.h): the model is F fragments, each with
// rounds of its own; one fragment is pushed every H/F inner steps, in cyclic order, so each is
// pushed every H steps and a sync moves about 1/F of the model. With [outer] overlap = tau > 0 the
// island goes on training tau steps after a push before it awaits the round and takes its result,
// as mix x local + (1 - mix) x global: the push streams on a thread of its own, and the push and
// the wait for the other islands are hidden behind those steps. A (re)joining island starts the
// cycle at the fragment whose round closes next (the first with the lowest version), so every
// island waits on the fragments in the same order and none waits on one that waits on it. On the
// run's last step the island pushes every fragment it trained since its last push and takes the
// global parameters whole: every island, and the server, end on the same parameters.
//
// Async ([outer] mode = "async"): no island ever waits for another. The island pushes on a thread
// of its own and trains on from its own parameters; that thread then awaits the version that closes
// the push's Delayed Nesterov period (the push reply names it: the period's N-th push, with the
// momentum step) and pulls it, and the island takes it at its next step by a rebase:
// local += pulled - base; base <- pulled, where base is the point its movement not yet pushed is
// measured from (its parameters at the push; the pseudo-gradient is base - local). So every island
// holds the whole period's update a step or two after the period closed, as DiLoCo's islands hold
// a round's, and keeps the steps it took meanwhile. When its next push comes first (the period
// waits on a slower island), it stops awaiting and takes the newest version instead, then pushes.
// The island pushes at the step that ends nearest to the beat its last push's reply named
// (rounds.h), at its pace over the round under way, and after at most twice the reply's H; its
// first rounds, before the server knows its speed, after H steps.
// From a push until it takes that push's period (or the newest version), the island is ahead: its
// steps start from parameters a period old. With [outer] yield (on by default) those steps run at
// idle CPU priority (compute(), yield.h), so cores it shares go to the islands still on their way
// to the beat; it never blocks.
//
// Faults: a server that restarts is reconnected to with backoff (OuterClient); a push it lost is
// sent again (Await says RESEND); an island the server dropped (lease expired) joins again and
// takes the current parameters; a stale push (the round closed without it) is dropped and the
// island takes the fragment's current parameters. Anything else is a loom::Error naming the server.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/outer/client.h"
#include "loom/outer/fragments.h"
#include "loom/train/config.h"
#include "loom/train/loop.h"
#include "loom/train/params.h"

namespace loom::outer {

// The shared token: [outer] token_file's content (trimmed), else $LOOM_OUTER_TOKEN. Throws
// loom::Error naming the file or the variable when there is none.
std::string read_token(const OuterConfig& c, const std::string& config_path);

class Island {
 public:
  // `name` labels the island in the server's log; `key` is its identity across restarts (host and
  // run directory): a restarted island gets its id, and so its data stream, back.
  Island(const train::Config& cfg, train::ParamStore& params, const std::string& name,
         const std::string& key = "");
  ~Island();

  uint64_t id() const { return id_; }
  bool async() const { return cfg_.mode == OuterMode::async; }
  // Inner steps until the next push or landing is due (the loop calls sync() then); async: 1 while
  // a pushed period's parameters are awaited (sync() takes them once they are there), and on the
  // way to the beat the next push falls on, half the steps left at the round's pace (the push is
  // made at the step that ends nearest to it).
  int64_t inner_steps() const;
  uint64_t version() const;  // the versions pulled, summed over the fragments
  // Async with a step budget ([outer] islands > 0): the lr schedule's clock shared by the islands,
  // from the last push reply taken: the steps every island pushed over the islands, moving at the
  // islands' summed speed over this island's, over the islands, per inner step of this one. A fast
  // island so reaches the schedule's end when the budget is spent, not at its own [train] steps
  // (and a slow one does not stop half-way down it). Off otherwise (the island's own steps).
  train::ScheduleClock clock() const;
  // `steps` inner steps that took `seconds` have passed since the last call: push, wait (sync) and
  // pull what is due; on the run's `last` step, everything (see above). Returns false once the
  // server's step budget is spent (async): stop training.
  bool sync(int64_t steps, double seconds, bool last);
  // train::OuterSync::on_params: `hook` runs before sync() reads (false) or writes (true) the
  // ParamStore's parameters.
  void on_params(std::function<void(bool writes)> hook) { touch_ = std::move(hook); }
  // train::OuterSync::compute: before (begins) and after each inner step's compute. A step of an
  // async island ahead of its period runs at idle CPU priority with [outer] yield (yield.h).
  void compute(bool begins);

  int64_t rounds() const { return rounds_; }  // pushes that stood (fragment rounds)
  double wait_s() const { return wait_s_; }   // time in push, await and pull, summed
  // The share of the island's wall time spent waiting for the server (in push, await and pull):
  // in the last round (from the push before the last to the last; from the island's start, for
  // the first); and in all, of the time since the island was made.
  double round_wait_share() const { return round_wait_share_; }
  double wait_share() const;
  // Async: the inner steps the island trained past its last push before it took that push's
  // period (or, the period still open at its next push, the newest version): steps from
  // parameters a period old, which the rebase keeps.
  int64_t ahead_steps() const { return ahead_steps_; }
  int64_t yield_steps() const { return yield_steps_; }  // inner steps run at idle CPU priority
  uint64_t bytes_sent() const { return client_->bytes_sent(); }
  uint64_t bytes_received() const { return client_->bytes_received(); }
  // The most bytes one round moved (its push and its pull), the final flush left out.
  uint64_t peak_round_bytes() const { return peak_round_bytes_; }

 private:
  // What a push's call returned (on the thread that sent it).
  struct Sent {
    grpc::Status status;
    proto::PushReply reply;
    uint64_t bytes = 0;
  };
  // A pushed fragment whose round the island has not taken yet.
  struct InFlight {
    uint32_t fragment = 0;
    uint64_t base_version = 0;
    int64_t steps = 1;  // inner steps it holds, and the wall time they took
    double seconds = 0;
    std::shared_ptr<const TensorList> grad;  // kept to push again if the server lost it
    int64_t land_at = 0;                     // the island's step at which it takes the round
    std::future<Sent> sending;               // the push under way on a thread of its own
    uint64_t bytes = 0;                      // of its push, sent again included
    bool stands = false;                     // the server took it (or held it already)
  };

  void join();
  // global_[f] <- the server's fragment f (joining again if the server dropped this island)
  void fetch(uint32_t f);
  // fetch(f); the ParamStore's <- mix x its own + (1 - mix) x those
  void pull(uint32_t f, double mix);
  // after a join: every fragment; then the cycle restarts at the next round to close
  void pull_all();
  // Starts pushing fragment f's pseudo-gradient on a thread of its own (the training goes on
  // while it streams); the round is then in flight.
  InFlight push(uint32_t f, double seconds);
  void send(InFlight& fl);  // starts fl's push (again, after RESEND)
  // Waits for fl's push to end and acts on the server's answer; false when it does not stand.
  bool sent(InFlight& fl);
  bool answered(const Sent& r);  // ... acts on a push's answer (H, done, dropped: join again)

  // ---- async (see above) ----
  // What a push's thread brings back: the push's answer, and global_[0] with its version: the
  // period's, if it closed before the island stopped awaiting it, else as they were.
  struct CatchUp {
    Sent push;
    grpc::Status wait;  // of the await or the pull
    bool pulled = false;
    TensorList params;
    uint64_t version = 0;
    uint64_t pull_bytes = 0;
  };
  void sync_rounds(bool last);  // sync: push, await and pull what is due
  void async_sync(bool last);
  // Pushes base_ - local on a thread that then awaits and pulls the push's period; base_ <- local.
  void async_push(double seconds);
  // Takes what the thread brought (first telling it to stop awaiting, when it is not done).
  void take_catch_up();
  void take_newest();  // fetch(0) now, and rebase
  // The steps left to the beat at the round's pace (infinity when there is no beat).
  double steps_to_beat() const;
  // The step by which the next push is due at the latest: twice the H of the reply that set a
  // beat, else next_push_.
  int64_t push_bound() const;
  void rebase();  // local += global_[0] - base_; base_ <- global_[0]
  // Waits for fl's round (sync), pulls the fragment and mixes it in with weight `mix` for the local
  // parameters; `counted`: its bytes count toward the peak.
  void land(InFlight& fl, double mix, bool counted);
  // One Await for fragment f's version past base_version, at most wait_ms: its state (and done_),
  // or none when the server had dropped this island (it has joined again and pulled). Other
  // failures throw naming `what` ("round 3"). `awaited`: whom the server says the round waits for.
  std::optional<proto::AwaitReply::State> await(uint32_t f, uint64_t base_version, uint32_t wait_ms,
                                                const std::string& what,
                                                std::string* awaited = nullptr);
  void heartbeat_loop();

  OuterConfig cfg_;
  train::ParamStore& params_;
  std::function<void(bool writes)> touch_;  // on_params
  void touch(bool writes) {
    if (touch_) touch_(writes);
  }
  std::string name_, key_;
  std::unique_ptr<OuterClient> client_;
  Fragments split_;                 // fragment -> its tensors' indices in the model
  std::vector<TensorList> global_;  // per fragment: its parameters as last pulled
  std::vector<uint64_t> versions_;  // per fragment: the version of global_
  std::vector<bool> held_;          // per fragment: global_ holds a version pulled (not zeros)
  std::vector<int64_t> since_;      // per fragment: inner steps since its last push
  std::optional<InFlight> in_flight_;
  TensorList base_;                // async: the point the movement not yet pushed is measured from
  std::future<CatchUp> catch_up_;  // async: the last push's thread, until taken
  std::atomic<bool> stop_awaiting_{false};
  bool caught_up_ = true;  // async: base_ holds a version pulled since the last push
  int64_t pushed_at_ = 0;  // async: the step of the last push
  // async: when the last push was made, and the wall seconds an inner step took in the round
  // before it; the beat its reply set for the next push (steady clock ticks; 0: none, push
  // after next_push_) and its H, set by the push's thread as soon as the reply is in
  std::chrono::steady_clock::time_point pushed_wall_;
  double step_wall_s_ = 0;
  std::atomic<int64_t> beat_at_{0}, beat_h_{0};
  train::ScheduleClock clock_;  // async: as the last push reply taken set it (its `now` aside)
  uint32_t next_ = 0;           // the fragment pushed next
  int64_t t_ = 0;               // inner steps since the island started
  int64_t next_push_ = 0;       // the step at which it is pushed
  double seconds_ = 0;          // the wall time of the steps since the last push
  std::atomic<uint64_t> id_{0};
  int64_t h_ = 1;  // H: a fragment's inner steps per round (the server's)
  // the server said its step budget is spent (any reply: a join's, a push's, an await's, a
  // heartbeat's, also on the async push thread and the heartbeat thread); never unset
  std::atomic<bool> done_{false};
  bool rejoined_ = false;  // join() ran inside a call: pull_all() is due
  int64_t rounds_ = 0;
  double wait_s_ = 0;
  double round_wait_share_ = 0;
  int64_t ahead_steps_ = 0;
  int64_t yield_steps_ = 0;
  bool idle_ = false;        // within compute(): the compute threads at idle CPU priority (yield.h)
  double round_wait_s_ = 0;  // waited since the last push
  uint64_t round_bytes_ = 0;  // async: moved since the last push (its push and pulls)
  std::chrono::steady_clock::time_point made_ = std::chrono::steady_clock::now(),
                                        round_start_ = made_;
  uint64_t peak_round_bytes_ = 0;
  uint64_t lease_ms_ = 10000;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace loom::outer
