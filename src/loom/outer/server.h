// The outer sync service (`loom outer-server`): holds the global parameters, the outer optimizer
// state, a version and the membership; islands join, pull, push pseudo-gradients and keep a lease.
//
// Calls (outer.proto), each refused with UNAUTHENTICATED unless it carries the shared token:
//   Join       a new island: gets an id, the version, its H and the lease; its model (tensor names and
//              shapes) must be the server's (FAILED_PRECONDITION otherwise, naming the tensor).
//   Heartbeat  renews the lease (so does every other call). A member whose lease runs out is dropped:
//              a sync round never waits for it again; it must Join afresh.
//   Pull       streams the current global parameters (f32) and their version.
//   Push       streams a pseudo-gradient (global - local; f32 or bf16). Every chunk is checked
//              (names, order, shapes, lengths, finite values) before anything is applied; a bad push
//              is INVALID_ARGUMENT naming the tensor and leaves the state untouched.
//              sync:  base_version must be the current version (else FAILED_PRECONDITION: stale),
//                     once per island per round (ALREADY_EXISTS). A round closes when every live member
//                     expected in it has pushed; the outer Nesterov step is taken on the mean.
//              async: applied at once with Delayed Nesterov (optimizer.h), whatever its base version
//                     (one from the future is INVALID_ARGUMENT). The reply tells the island its next H,
//                     scaled by its measured speed against the fastest island's (slow islands take
//                     fewer local steps), and `done` once the pushed inner steps reach the budget.
//   Await      sync: waits up to wait_ms for the island's round to close: CLOSED, PENDING, or RESEND
//              when the server holds no push from it for that round (the server restarted mid-round).
//   Leave      an island that has finished leaves at once, so no round waits for its lease to expire.
//
// Membership: an island joining while a round has pushes is expected from the next round on (its
// push still counts in the current one if it arrives in time); before the first round closes every
// island that joins is expected in it. Sync mode with `min_islands` > 0 starts with a barrier: the
// first round closes only once that many islands have pushed to it, or `start_grace_s` after its first
// push (islands that never come are not waited for forever).
//
// Durability: after every round (sync) or push (async), before any caller can see the new version,
// the state (parameters, momentum, Delayed Nesterov buffer, version, membership) is written atomically
// to STATE_DIR/outer_state.safetensors. A restarted server resumes from it: members keep their ids
// with fresh leases, and only the pushes of the round in flight are lost (islands re-push on RESEND).
// A state that cannot be written (full disk) stops the server with exit status 1 and a message rather
// than serving a version that a restart would not know.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/outer/optimizer.h"
#include "loom/outer/tensors.h"
#include "loom/train/config.h"

namespace loom::outer {

using train::OuterMode;

struct ServerConfig {
  OuterMode mode = OuterMode::sync;
  OuterOptConfig opt;
  int64_t inner_steps = 50;   // H
  int64_t delay = 0;          // async: Delayed Nesterov period N; 0: `islands`, or 1 if that is 0
  int64_t step_budget = 0;    // async: inner steps, summed over pushes, after which islands stop
  double lease_s = 10;
  int64_t min_islands = 0;     // sync: pushes the first round waits for ([outer] islands)
  double start_grace_s = 60;   // ... at most this long after its first push
  std::string state_dir;      // "": keep no state on disk
  std::string token;          // required, non-empty
  std::string tls_cert, tls_key;  // PEM files; both empty: plaintext
  bool verbose = true;        // a line on stderr per round and membership change
};

class OuterServer {
 public:
  // Starts from STATE_DIR's state when there is one (its tensors must match `initial`'s names and
  // shapes, and its mode the config's), else from `initial`. Throws loom::Error naming the file.
  OuterServer(ServerConfig cfg, TensorList initial);
  ~OuterServer();

  // Listens on `addr` ("127.0.0.1:0" picks a free port); returns the port. Throws loom::Error.
  int start(const std::string& addr);
  // Stops accepting calls, finishes those in flight, writes the state.
  void shutdown();
  void wait();

  uint64_t version() const;
  TensorList params() const;
  size_t members() const;
  int64_t pushes() const;  // accepted since start

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The state file's name inside a state directory, and a reader for it: the global parameters as
// the file holds them ("param.<name>"), and the version.
std::string state_file(const std::string& state_dir);
TensorList read_state_params(const std::string& path, uint64_t* version = nullptr);

}  // namespace loom::outer
