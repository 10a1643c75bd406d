// The outer sync service (`loom outer-server`): the gRPC adapter over the calls (service.h). It
// listens, checks each call's token and forwards the call; the service decodes tensor streams
// (tensors.h), translates each call into a call on Rounds under one lock, and the refusals into
// gRPC statuses. Not here: the rules of membership and rounds (rounds.h), the state's format
// (state_file.h). Invariant: a new version is on disk before any island can see it, so no island
// sees a version a restarted server would not know.
//
// Calls (outer.proto), each refused with UNAUTHENTICATED unless it carries the shared token:
//   Join       a new island: gets an id, the version, its H and the lease; its model (tensor
//              names and shapes) and its fragments must be the server's (FAILED_PRECONDITION
//              otherwise, naming the tensor or the fragments).
//   Heartbeat  renews the lease (so does every other call). A member whose lease runs out is
//              dropped: a sync round never waits for it again; it must Join afresh (NOT_FOUND
//              until then).
//   Pull       streams one fragment's global parameters (f32) and its version; or, to an island
//              one version behind that asks, the quantised update from its version (int8, int4).
//   Push       streams a fragment's pseudo-gradient (global - local; f32, bf16, int8 or int4;
//              the whole model with one fragment). Every chunk is checked
//              (names, order, shapes, lengths, finite values) before anything is applied; a bad
//              push is INVALID_ARGUMENT naming the tensor and leaves the state untouched.
//              sync: a stale push is FAILED_PRECONDITION, a second one in a round ALREADY_EXISTS.
//              async: applied at once; one from the future is INVALID_ARGUMENT. The reply tells
//              the island its next H, and `done` once the pushed inner steps reach the budget.
//   Await      sync: waits up to wait_ms for the island's round of a fragment to close: CLOSED,
//              PENDING, or RESEND when the server holds no push from it for that round (it
//              restarted).
//   Leave      an island that has finished leaves at once, so no round waits for its lease.
//
// Durability: after every round (sync) or push (async), before any caller can see the new version,
// the state is written atomically to STATE_DIR/outer_state.safetensors (state_file.h). A restarted
// server resumes from it: members keep their ids with fresh leases, and only the pushes of the
// round in flight are lost (islands re-push on RESEND). A state that cannot be written (full disk)
// stops the server with exit status 1 and a message rather than serving a version that a restart
// would not know.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/outer/service.h"

namespace loom::outer {

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

}  // namespace loom::outer
