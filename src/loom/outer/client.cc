#include "loom/outer/client.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::outer {

using Clock = std::chrono::steady_clock;

OuterClient::OuterClient(ClientConfig cfg, TensorList spec)
    : cfg_(std::move(cfg)), spec_(std::move(spec)) {
  if (cfg_.token.empty())
    throw Error(fmt::format("outer server {}: no token", cfg_.server),
                "set LOOM_OUTER_TOKEN or [outer] token_file");
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!cfg_.tls_ca.empty()) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = read_file(cfg_.tls_ca);
    creds = grpc::SslCredentials(o);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  // reconnect quickly after a server restart (gRPC's default backoff grows to 2 minutes)
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetMaxReceiveMessageSize(int(kChunkBytes) + (1 << 16));
  channel_ = grpc::CreateCustomChannel(cfg_.server, creds, args);
  stub_ = proto::OuterSync::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> OuterClient::context(double timeout_s) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", "Bearer " + cfg_.token);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  return ctx;
}

template <class F>
grpc::Status OuterClient::retrying(const char* what, F&& call) {
  auto t0 = Clock::now();
  double backoff = 0.1;
  for (;;) {
    grpc::Status s = call();
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
      throw Error(fmt::format("outer server {} refused the token ({}): {}", cfg_.server, what,
                              s.error_message()),
                  "islands and server must share LOOM_OUTER_TOKEN or [outer] token_file");
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
      return s;
    double waited = seconds_since(t0);
    if (waited > cfg_.retry_s)
      throw Error(fmt::format("outer server {} unreachable for {:.0f} s ({}): {}", cfg_.server,
                              waited, what, s.error_message()),
                  "is loom outer-server running there? [outer] retry_s sets how long to wait");
    auto until =
        std::chrono::system_clock::now() + std::chrono::milliseconds(int64_t(backoff * 1000));
    if (channel_->WaitForConnected(until))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // connected (again): retry soon
    else
      backoff = std::min(backoff * 2, 2.0);
  }
}

grpc::Status OuterClient::join(const std::string& name, proto::JoinReply* rep,
                               const std::string& key, uint32_t fragments, uint32_t paths,
                               uint32_t path) {
  proto::JoinRequest req;
  req.set_name(name);
  req.set_key(key);
  req.set_fragments(fragments);
  req.set_paths(paths);
  req.set_path(path);
  for (const auto& t : spec_) {
    auto* m = req.add_model();
    m->set_name(t.name);
    for (int64_t d : t.shape) m->add_shape(d);
  }
  return retrying("join", [&] { return stub_->Join(context(10).get(), req, rep); });
}

grpc::Status OuterClient::heartbeat(uint64_t id, proto::HeartbeatReply* rep) {
  proto::HeartbeatRequest req;
  req.set_island_id(id);
  // one try: the heartbeat thread calls again soon
  return stub_->Heartbeat(context(5).get(), req, rep);
}

grpc::Status OuterClient::pull(uint64_t id, uint32_t fragment, TensorList& params,
                               uint64_t* version, bool want_update) {
  proto::PullRequest req;
  req.set_island_id(id);
  req.set_fragment(fragment);
  req.set_have_version(*version);
  req.set_want_update(want_update);
  return retrying("pull", [&]() -> grpc::Status {
    auto ctx = context(300);
    auto rd = stub_->Pull(ctx.get(), req);
    proto::PullReply r;
    Assembler as(params);
    bool head = false, update = false;
    uint64_t v = 0;
    while (rd->Read(&r)) {
      if (!head) {
        head = true;
        v = r.version();
        update = r.update();
      }
      if (r.has_chunk()) {
        std::string err = as.add(r.chunk());
        if (!err.empty()) {
          ctx->TryCancel();
          rd->Finish();
          throw Error(fmt::format("outer server {}: bad pull: {}", cfg_.server, err));
        }
      }
    }
    grpc::Status s = rd->Finish();
    if (!s.ok()) return s;
    if (std::string err = as.finish(); !err.empty())
      throw Error(fmt::format("outer server {}: bad pull: {}", cfg_.server, err));
    if (update && !want_update)
      throw Error(fmt::format("outer server {}: bad pull: an update this island did not ask for",
                              cfg_.server));
    received_ += as.bytes_received();
    if (update) {  // the parameters of *version plus the update, as the server committed them
      for (size_t t = 0; t < params.size(); ++t)
        for (size_t i = 0; i < params[t].data.size(); ++i)
          params[t].data[i] += as.tensors()[t].data[i];
    } else {
      params = std::move(as.tensors());
    }
    *version = v;
    return s;
  });
}

grpc::Status OuterClient::push(const proto::PushHeader& h, const TensorList& grad,
                               proto::Encoding enc, proto::PushReply* rep) {
  return retrying("push", [&]() -> grpc::Status {
    auto ctx = context(300);
    auto w = stub_->Push(ctx.get(), rep);
    proto::PushRequest m;
    *m.mutable_header() = h;
    uint64_t bytes = 0;
    bool ok = w->Write(m);
    m.clear_header();
    if (ok)
      ok = for_each_chunk(grad, enc, [&](proto::TensorChunk& c) {
        bytes += c.data().size();
        m.mutable_chunk()->Swap(&c);
        return w->Write(m);
      });
    w->WritesDone();
    grpc::Status s = w->Finish();
    if (s.ok()) sent_ += bytes;
    return s;
  });
}

grpc::Status OuterClient::leave(uint64_t id) {
  proto::LeaveRequest req;
  proto::LeaveReply rep;
  req.set_island_id(id);
  return stub_->Leave(context(5).get(), req, &rep);
}

grpc::Status OuterClient::await(uint64_t id, uint32_t fragment, uint64_t base_version,
                                uint32_t wait_ms, proto::AwaitReply* rep,
                                const std::atomic<bool>* stop, uint64_t period) {
  proto::AwaitRequest req;
  req.set_island_id(id);
  req.set_fragment(fragment);
  req.set_base_version(base_version);
  req.set_wait_ms(wait_ms);
  req.set_period(period);
  return retrying("await", [&] {
    auto ctx = context(wait_ms / 1000.0 + 10);
    if (stop) {
      std::lock_guard<std::mutex> lk(await_mu_);
      if (*stop) return grpc::Status(grpc::StatusCode::CANCELLED, "no longer awaited");
      awaiting_ = ctx.get();
    }
    grpc::Status s = stub_->Await(ctx.get(), req, rep);
    if (stop) {
      std::lock_guard<std::mutex> lk(await_mu_);
      awaiting_ = nullptr;
    }
    return s;
  });
}

void OuterClient::cancel_await() {
  std::lock_guard<std::mutex> lk(await_mu_);
  if (awaiting_) awaiting_->TryCancel();
}

}  // namespace loom::outer
