// The island's side of the outer sync service: one gRPC channel to the server, calls with
// deadlines, and reconnection with exponential backoff (0.1 s doubling to 2 s) while the server is
// unreachable, for at most `retry_s` before giving up with a loom::Error naming the server. Between
// tries the caller waits on the channel's connection (a synchronous client's connection attempts
// only make progress while some thread polls it; a plain sleep would leave them to gRPC's 5 s
// backup poller).
//
// Each call returns the server's grpc::Status for the caller to act on (NOT_FOUND: join again;
// FAILED_PRECONDITION: stale, pull and go on); UNAUTHENTICATED is thrown as a loom::Error at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "loom/outer/outer.grpc.pb.h"
#include "loom/outer/tensors.h"

namespace loom::outer {

struct ClientConfig {
  std::string server;  // host:port
  std::string token;
  std::string tls_ca;  // PEM file of the certificate (or its CA) to trust; "": plaintext
  double retry_s = 120;
};

class OuterClient {
 public:
  // `spec`: the model's tensors (names and shapes; data unused), in the server's order.
  OuterClient(ClientConfig cfg, TensorList spec);

  // `key`: the island's identity across restarts (JoinRequest.key); "" for none. `fragments`: the
  // island's [outer] fragments. `paths`, `path`: DiPaCo's (JoinRequest), 0 and 0 without.
  grpc::Status join(const std::string& name, proto::JoinReply* rep, const std::string& key = "",
                    uint32_t fragments = 1, uint32_t paths = 0, uint32_t path = 0);
  grpc::Status heartbeat(uint64_t id, proto::HeartbeatReply* rep);
  // Fills `params` (shaped like the fragment's tensors: fragments.h) and *version (the fragment's).
  // `want_update`: params holds the fragment's parameters of *version, and the server may send
  // the quantised update from there (added to them) instead of the parameters.
  grpc::Status pull(uint64_t id, uint32_t fragment, TensorList& params, uint64_t* version,
                    bool want_update = false);
  grpc::Status push(const proto::PushHeader& h, const TensorList& grad, proto::Encoding enc,
                    proto::PushReply* rep);
  // `stop`: when set, an await that sees it set, or is under way when cancel_await() is called,
  // ends at once with CANCELLED (one thread awaits while another decides it need not).
  // `period` (async), when not 0: awaits that Delayed Nesterov period's close instead.
  grpc::Status await(uint64_t id, uint32_t fragment, uint64_t base_version, uint32_t wait_ms,
                     proto::AwaitReply* rep, const std::atomic<bool>* stop = nullptr,
                     uint64_t period = 0);
  // Cancels the await under way with a `stop` (set `*stop` first).
  void cancel_await();
  grpc::Status leave(uint64_t id);  // one try

  // Payload bytes of tensor data sent (pushes) and received (pulls), as encoded on the wire.
  uint64_t bytes_sent() const { return sent_; }
  uint64_t bytes_received() const { return received_; }
  const std::string& server() const { return cfg_.server; }

 private:
  template <class F>
  grpc::Status retrying(const char* what, F&& call);
  std::unique_ptr<grpc::ClientContext> context(double timeout_s) const;

  ClientConfig cfg_;
  TensorList spec_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::OuterSync::Stub> stub_;
  std::atomic<uint64_t> sent_{0}, received_{0};
  std::mutex await_mu_;
  grpc::ClientContext* awaiting_ = nullptr;  // the await a cancel_await() cancels
};

}  // namespace loom::outer
