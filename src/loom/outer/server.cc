#include "loom/outer/server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/outer/outer.grpc.pb.h"

namespace loom::outer {

using grpc::Status;
using grpc::StatusCode;

// The gRPC adapter: each call's token checked, then the call forwarded to the service.
struct OuterServer::Impl final : proto::OuterSync::Service {
  OuterService svc;
  std::unique_ptr<grpc::Server> server;
  std::thread sweeper;
  std::atomic<bool> stopping{false};

  Impl(ServerConfig c, TensorList initial) : svc(std::move(c), std::move(initial)) {}

  Status check_token(grpc::ServerContext* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    std::string got = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    if (!svc.token_matches(got))
      return Status(StatusCode::UNAUTHENTICATED, it == md.end() ? "no token" : "wrong token");
    return Status::OK;
  }

  void sweep() {
    while (!stopping) {
      svc.expire();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  Status Join(grpc::ServerContext* ctx, const proto::JoinRequest* req,
              proto::JoinReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    return svc.join(*req, rep);
  }
  Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                   proto::HeartbeatReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    return svc.heartbeat(*req, rep);
  }
  Status Pull(grpc::ServerContext* ctx, const proto::PullRequest* req,
              grpc::ServerWriter<proto::PullReply>* w) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    return svc.pull(*req, [w](const proto::PullReply& r) { return w->Write(r); });
  }
  Status Push(grpc::ServerContext* ctx, grpc::ServerReader<proto::PushRequest>* rd,
              proto::PushReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    return svc.push([rd](proto::PushRequest& m) { return rd->Read(&m); }, rep);
  }
  Status Leave(grpc::ServerContext* ctx, const proto::LeaveRequest* req,
               proto::LeaveReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    return svc.leave(*req, rep);
  }
  Status Await(grpc::ServerContext* ctx, const proto::AwaitRequest* req,
               proto::AwaitReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    return svc.await(*req, rep);
  }
};

OuterServer::OuterServer(ServerConfig cfg, TensorList initial)
    : impl_(std::make_unique<Impl>(std::move(cfg), std::move(initial))) {}

OuterServer::~OuterServer() { shutdown(); }

int OuterServer::start(const std::string& addr) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  const ServerConfig& c = impl_->svc.config();
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
  impl_->svc.save();  // the state exists from the start
  impl_->sweeper = std::thread([this] { impl_->sweep(); });
  impl_->svc.log(fmt::format("listening on port {} ({} mode, {})", port, outer_mode_name(c.mode),
                             c.tls_cert.empty() ? "plaintext" : "TLS"));
  return port;
}

void OuterServer::shutdown() {
  if (!impl_ || !impl_->server) return;
  impl_->stopping = true;
  impl_->svc.stop();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (impl_->sweeper.joinable()) impl_->sweeper.join();
  impl_->svc.save();
  impl_->server.reset();
}

void OuterServer::wait() {
  if (impl_->server) impl_->server->Wait();
}

uint64_t OuterServer::version() const { return impl_->svc.version(); }
TensorList OuterServer::params() const { return impl_->svc.params(); }
size_t OuterServer::members() const { return impl_->svc.members(); }
int64_t OuterServer::pushes() const { return impl_->svc.pushes(); }

}  // namespace loom::outer
