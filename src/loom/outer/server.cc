#include "loom/outer/server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/outer/outer.grpc.pb.h"

namespace loom::outer {

namespace fs = std::filesystem;
using Clock = Rounds::Clock;
using grpc::Status;
using grpc::StatusCode;

namespace {

// Compares without returning early at the first differing byte.
bool same_token(const std::string& got, const std::string& want) {
  if (got.size() != want.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < got.size(); ++i) d |= uint8_t(got[i]) ^ uint8_t(want[i]);
  return d == 0;
}

ServerConfig with_token(ServerConfig c) {
  if (c.token.empty())
    throw Error("outer server: no token", "set LOOM_OUTER_TOKEN or [outer] token_file");
  return c;
}

Status refused(const Refusal& r) {
  switch (r.kind) {
    case RefusalKind::not_member:
      return Status(StatusCode::NOT_FOUND, r.message);
    case RefusalKind::other_model:
    case RefusalKind::stale:
      return Status(StatusCode::FAILED_PRECONDITION, r.message);
    case RefusalKind::invalid:
      return Status(StatusCode::INVALID_ARGUMENT, r.message);
    case RefusalKind::duplicate:
      return Status(StatusCode::ALREADY_EXISTS, r.message);
  }
  return Status(StatusCode::INTERNAL, r.message);
}

proto::AwaitReply::State await_state(RoundState s) {
  switch (s) {
    case RoundState::closed:
      return proto::AwaitReply::CLOSED;
    case RoundState::resend:
      return proto::AwaitReply::RESEND;
    case RoundState::pending:
      break;
  }
  return proto::AwaitReply::PENDING;
}

}  // namespace

struct OuterServer::Impl final : proto::OuterSync::Service {
  ServerConfig cfg;
  mutable std::mutex mu;
  std::condition_variable cv;  // notified when the version moves, and on shutdown
  Rounds rounds;               // under mu
  std::set<uint64_t> pushing;  // islands with a push streaming in, under mu

  std::unique_ptr<grpc::Server> server;
  std::thread sweeper;
  std::atomic<bool> stopping{false};

  Impl(ServerConfig c, TensorList initial)
      : cfg(with_token(std::move(c))),
        rounds(cfg, std::move(initial),
               {[this](const std::string& s) { log(s); },
                [this] {
                  save_locked();
                  cv.notify_all();
                }}) {
    const std::string path = state_file(cfg.state_dir);
    if (!cfg.state_dir.empty() && fs::exists(path)) {
      rounds.resume(read_state(path, cfg.mode, rounds.spec()), Clock::now());
      log(fmt::format("resumed from {}: version {}, {} members", path, rounds.version(),
                      rounds.members()));
    }
  }

  void save_locked() {
    if (cfg.state_dir.empty()) return;
    try {
      write_state(state_file(cfg.state_dir), rounds.meta(), *rounds.params(), rounds.momentum(),
                  rounds.buffer());
    } catch (const Error& e) {
      // A version nobody can recover must not be served. The file on disk is the last good state
      // (the write is atomic); islands re-send what this server loses, once it is restarted.
      std::fprintf(stderr,
                   "outer-server: error: cannot save the state at version %llu: %s\n"
                   "outer-server: stopping; the previous state is intact, restart once fixed\n",
                   (unsigned long long)rounds.version(), e.what());
      std::_Exit(1);
    }
  }

  void log(const std::string& s) const {
    if (cfg.verbose) fmt::print(stderr, "outer-server: {}\n", s);
  }

  Status check_token(grpc::ServerContext* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    std::string got = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    if (!same_token(got, "Bearer " + cfg.token))
      return Status(StatusCode::UNAUTHENTICATED, it == md.end() ? "no token" : "wrong token");
    return Status::OK;
  }

  void sweep() {
    while (!stopping) {
      {
        std::lock_guard<std::mutex> lk(mu);
        rounds.expire(Clock::now());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // ---- the calls ----

  Status Join(grpc::ServerContext* ctx, const proto::JoinRequest* req,
              proto::JoinReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    TensorList model;
    for (const auto& m : req->model())
      model.push_back({m.name(), std::vector<int64_t>(m.shape().begin(), m.shape().end()), {}});
    std::lock_guard<std::mutex> lk(mu);
    Rounds::Joined j;
    if (auto r = rounds.join(req->name(), model, Clock::now(), &j)) return refused(*r);
    rep->set_island_id(j.island_id);
    rep->set_version(j.version);
    rep->set_inner_steps(j.inner_steps);
    rep->set_lease_ms(uint64_t(rounds.lease().count()));
    rep->set_mode(train::outer_mode_name(cfg.mode));
    rep->set_done(j.done);
    return Status::OK;
  }

  Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                   proto::HeartbeatReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::lock_guard<std::mutex> lk(mu);
    if (auto r = rounds.touch(req->island_id(), Clock::now())) return refused(*r);
    rep->set_version(rounds.version());
    rep->set_done(rounds.done());
    return Status::OK;
  }

  Status Pull(grpc::ServerContext* ctx, const proto::PullRequest* req,
              grpc::ServerWriter<proto::PullReply>* w) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::shared_ptr<const TensorList> snap;
    uint64_t v;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (auto r = rounds.touch(req->island_id(), Clock::now())) return refused(*r);
      snap = rounds.params();
      v = rounds.version();
    }
    proto::PullReply head;
    head.set_version(v);
    if (!w->Write(head)) return Status(StatusCode::CANCELLED, "the island went away");
    proto::PullReply r;
    bool ok = for_each_chunk(*snap, proto::F32, [&](proto::TensorChunk& c) {
      r.mutable_chunk()->Swap(&c);
      return w->Write(r);
    });
    return ok ? Status::OK : Status(StatusCode::CANCELLED, "the island went away");
  }

  Status Push(grpc::ServerContext* ctx, grpc::ServerReader<proto::PushRequest>* rd,
              proto::PushReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    proto::PushRequest msg;
    if (!rd->Read(&msg) || !msg.has_header())
      return Status(StatusCode::INVALID_ARGUMENT, "a push must start with its header");
    const PushInfo h{msg.header().island_id(), msg.header().base_version(),
                     msg.header().inner_steps(), msg.header().seconds()};
    {
      std::lock_guard<std::mutex> lk(mu);
      if (auto r = rounds.touch(h.island_id, Clock::now())) return refused(*r);
      // one push in flight per island: each holds a model-sized buffer while it streams, so an
      // island cannot make the server hold more than one (100 header-only pushes made it 18x)
      if (!pushing.insert(h.island_id).second)
        return Status(
            StatusCode::RESOURCE_EXHAUSTED,
            fmt::format("island {} already has a push in flight: one at a time", h.island_id));
    }
    struct Done {
      Impl* s;
      uint64_t id;
      ~Done() {
        std::lock_guard<std::mutex> lk(s->mu);
        s->pushing.erase(id);
      }
    } done{this, h.island_id};
    if (auto r = Rounds::check_header(h)) return refused(*r);
    Assembler as(rounds.spec());  // the spec is fixed: no lock
    bool first = true;
    do {
      if (!first && msg.has_header())
        return Status(StatusCode::INVALID_ARGUMENT,
                      "a push carries one header, in its first message");
      first = false;
      if (msg.has_chunk()) {
        std::string err = as.add(msg.chunk());
        if (!err.empty()) return Status(StatusCode::INVALID_ARGUMENT, "push: " + err);
      }
    } while (rd->Read(&msg));
    if (std::string err = as.finish(); !err.empty())
      return Status(StatusCode::INVALID_ARGUMENT, "push: " + err);
    std::lock_guard<std::mutex> lk(mu);
    Rounds::Pushed p;
    if (auto r = rounds.push(h, as.tensors(), Clock::now(), &p)) return refused(*r);
    rep->set_version(p.version);
    rep->set_inner_steps(p.inner_steps);
    rep->set_done(p.done);
    return Status::OK;
  }

  Status Leave(grpc::ServerContext* ctx, const proto::LeaveRequest* req,
               proto::LeaveReply*) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::lock_guard<std::mutex> lk(mu);
    if (auto r = rounds.leave(req->island_id(), Clock::now())) return refused(*r);
    return Status::OK;
  }

  Status Await(grpc::ServerContext* ctx, const proto::AwaitRequest* req,
               proto::AwaitReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::unique_lock<std::mutex> lk(mu);
    if (auto r = rounds.touch(req->island_id(), Clock::now())) return refused(*r);
    auto until =
        Clock::now() + std::chrono::milliseconds(std::min<uint32_t>(req->wait_ms(), 10000));
    cv.wait_until(lk, until, [&] { return rounds.version() > req->base_version() || stopping; });
    if (auto r = rounds.touch(req->island_id(), Clock::now())) return refused(*r);
    rep->set_version(rounds.version());
    rep->set_done(rounds.done());
    rep->set_state(await_state(rounds.round_state(req->island_id(), req->base_version())));
    return Status::OK;
  }
};

OuterServer::OuterServer(ServerConfig cfg, TensorList initial)
    : impl_(std::make_unique<Impl>(std::move(cfg), std::move(initial))) {}

OuterServer::~OuterServer() { shutdown(); }

int OuterServer::start(const std::string& addr) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  const ServerConfig& c = impl_->cfg;
  if (c.tls_cert.empty() != c.tls_key.empty())
    throw Error("outer server: TLS needs both [outer] tls_cert and tls_key");
  if (!c.tls_cert.empty()) {
    // gRPC says only that it cannot listen: name the file that is not what it should be
    auto pem = [](const std::string& path, const char* key, const char* what, const char* begin) {
      std::string text = read_file(path);
      if (text.find(begin) == std::string::npos)
        throw Error(fmt::format("outer server: [outer] {} {}: not a PEM {} (no \"{}\")", key, path,
                                what, begin),
                    "point it at a PEM file: `openssl x509 -in F -noout` checks a certificate, "
                    "`openssl pkey -in F -noout` a key");
      return text;
    };
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back(
        {pem(c.tls_key, "tls_key", "private key", "PRIVATE KEY-----"),
         pem(c.tls_cert, "tls_cert", "certificate", "-----BEGIN CERTIFICATE-----")});
    creds = grpc::SslServerCredentials(opts);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  int port = 0;
  grpc::ServerBuilder b;
  // gRPC binds with SO_REUSEPORT by default, so a second server on a port in use would start and
  // split the islands' calls with the first: refuse the port instead
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.AddListeningPort(addr, creds, &port);
  b.RegisterService(impl_.get());
  b.SetMaxReceiveMessageSize(int(kChunkBytes) + (1 << 16));
  impl_->server = b.BuildAndStart();
  if (!impl_->server || port == 0)
    throw Error(fmt::format("outer server: cannot listen on {}", addr),
                c.tls_cert.empty()
                    ? "is the port in use? \"127.0.0.1:0\" picks a free one"
                    : fmt::format("is the port in use (\"127.0.0.1:0\" picks a free one), or do "
                                  "the certificate {} and the key {} not belong together?",
                                  c.tls_cert, c.tls_key));
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->save_locked();  // the state exists from the start
  }
  impl_->sweeper = std::thread([this] { impl_->sweep(); });
  impl_->log(fmt::format("listening on port {} ({} mode, {})", port, train::outer_mode_name(c.mode),
                         c.tls_cert.empty() ? "plaintext" : "TLS"));
  return port;
}

void OuterServer::shutdown() {
  if (!impl_ || !impl_->server) return;
  impl_->stopping = true;
  impl_->cv.notify_all();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (impl_->sweeper.joinable()) impl_->sweeper.join();
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->save_locked();
  impl_->server.reset();
}

void OuterServer::wait() {
  if (impl_->server) impl_->server->Wait();
}

uint64_t OuterServer::version() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->rounds.version();
}
TensorList OuterServer::params() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return *impl_->rounds.params();
}
size_t OuterServer::members() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->rounds.members();
}
int64_t OuterServer::pushes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->rounds.pushes();
}

}  // namespace loom::outer
