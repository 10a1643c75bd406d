// The outer sync service's calls without the network: a call's decoded request in, its reply out,
// and a grpc::Status for the outcome. The gRPC server (server.h) checks each call's token and
// forwards it here; the fuzz target of the request decoder (fuzz/targets/outer_requests.cc) drives
// it with whatever bytes it makes, as a hostile island could send them.
//
// It translates each call into calls on Rounds (rounds.h) under one lock, decodes pushed tensor
// streams with an Assembler (tensors.h), and turns refusals into gRPC statuses (see server.h for
// the calls and their statuses). Invariant: every call on Rounds is made under the lock, and a new
// version is written to the state file before the lock is released.
#pragma once

#include <grpcpp/support/status.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "loom/outer/outer.pb.h"
#include "loom/outer/rounds.h"
#include "loom/outer/state_file.h"
#include "loom/outer/tensors.h"

namespace loom::outer {

// The rounds' settings (mode, H, lease, ...), and the network's and the disk's.
struct ServerConfig : RoundsConfig {
  std::string state_dir;          // "": keep no state on disk
  std::string token;              // required, non-empty
  std::string tls_cert, tls_key;  // PEM files; both empty: plaintext
  bool verbose = true;            // a line on stderr per round and membership change
};

class OuterService {
 public:
  using Status = grpc::Status;

  // Starts from STATE_DIR's state when there is one (its tensors must match `initial`'s names and
  // shapes, and its mode the config's), else from `initial`. Throws loom::Error naming the file,
  // or when the config has no token.
  OuterService(ServerConfig cfg, TensorList initial);

  Status join(const proto::JoinRequest& req, proto::JoinReply* rep);
  Status heartbeat(const proto::HeartbeatRequest& req, proto::HeartbeatReply* rep);
  // Streams the parameters: `write` sends one message, false when the island went away.
  Status pull(const proto::PullRequest& req,
              const std::function<bool(const proto::PullReply&)>& write);
  // Reads the pushed stream: `read` fills the next message, false at its end (or when it broke).
  Status push(const std::function<bool(proto::PushRequest&)>& read, proto::PushReply* rep);
  // Waits up to the request's wait_ms (at most 10 s) for the island's round to close.
  Status await(const proto::AwaitRequest& req, proto::AwaitReply* rep);
  Status leave(const proto::LeaveRequest& req, proto::LeaveReply* rep);

  bool token_matches(const std::string& bearer) const;  // "Bearer <token>", compared in full
  void expire();                                        // drops the members whose lease ran out
  void save();  // writes the state file (no state dir: nothing); a failure exits the process
  void stop();  // wakes every await: the server is going down
  void log(const std::string& line) const;

  const ServerConfig& config() const { return cfg_; }
  uint64_t version() const;
  TensorList params() const;
  size_t members() const;
  int64_t pushes() const;  // accepted since start

 private:
  void save_locked();

  ServerConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // notified when the version moves, and on stop
  Rounds rounds_;               // under mu_
  std::set<uint64_t> pushing_;  // islands with a push streaming in, under mu_
  bool stopping_ = false;       // under mu_
};

}  // namespace loom::outer
