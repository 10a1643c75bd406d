// An island's side of the outer loop, driven by `loom train` when [outer] server is set.
//
// On construction it joins the server and replaces the local parameters with the global ones (so
// every island starts from the same weights). Every H inner steps the training loop calls sync():
// the pseudo-gradient (global - local) is pushed, in sync mode the island waits for the round to
// close, and the new global parameters are pulled into the ParamStore. The inner optimizer state
// never leaves the island. A heartbeat thread keeps the lease alive, also while the island waits.
//
// Faults: a server that restarts is reconnected to with backoff (OuterClient); a push it lost is
// sent again (Await says RESEND); an island the server dropped (lease expired) joins again and
// takes the current parameters; a stale push (the round closed without it) is dropped and the
// island takes the current parameters. Anything else is a loom::Error naming the server.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "loom/outer/client.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::outer {

// The shared token: [outer] token_file's content (trimmed), else $LOOM_OUTER_TOKEN. Throws
// loom::Error naming the file or the variable when there is none.
std::string read_token(const train::OuterConfig& c, const std::string& config_path);

class Island {
 public:
  // `name` labels the island in the server's log; `key` is its identity across restarts (host and
  // run directory): a restarted island gets its id, and so its data stream, back.
  Island(const train::Config& cfg, train::ParamStore& params, const std::string& name,
         const std::string& key = "");
  ~Island();

  uint64_t id() const { return id_; }
  int64_t inner_steps() const { return h_; }  // H for the round under way
  uint64_t version() const { return version_; }
  // Ends a round of `steps` inner steps that took `seconds`: push, wait (sync), pull into the
  // ParamStore. Returns false once the server's step budget is spent (async): stop training.
  bool sync(int64_t steps, double seconds);

  int64_t rounds() const { return rounds_; }
  double wait_s() const { return wait_s_; }  // time in push, await and pull, summed
  uint64_t bytes_sent() const { return client_->bytes_sent(); }
  uint64_t bytes_received() const { return client_->bytes_received(); }

 private:
  void join();
  void pull();  // global_ and the ParamStore <- the server's parameters
  // One Await for a version past base_version, at most wait_ms: its state (and done_), or none
  // when the server had dropped this island (it has joined again). Other failures throw naming
  // `what` ("round 3").
  std::optional<proto::AwaitReply::State> await(uint64_t base_version, uint32_t wait_ms,
                                                const std::string& what);
  void heartbeat_loop();

  train::OuterConfig cfg_;
  train::ParamStore& params_;
  std::string name_, key_;
  std::unique_ptr<OuterClient> client_;
  TensorList global_;  // the parameters of version_, as pulled
  std::atomic<uint64_t> id_{0};
  uint64_t version_ = 0;
  int64_t h_ = 1;
  bool done_ = false;
  int64_t rounds_ = 0;
  double wait_s_ = 0;
  uint64_t lease_ms_ = 10000;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace loom::outer
