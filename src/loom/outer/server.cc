#include "loom/outer/server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/outer/outer.grpc.pb.h"

namespace loom::outer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using grpc::Status;
using grpc::StatusCode;

std::string state_file(const std::string& state_dir) { return state_dir + "/outer_state.safetensors"; }

namespace {

// Compares without returning early at the first differing byte.
bool same_token(const std::string& got, const std::string& want) {
  if (got.size() != want.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < got.size(); ++i) d |= uint8_t(got[i]) ^ uint8_t(want[i]);
  return d == 0;
}

struct Member {
  std::string name;
  Clock::time_point deadline;
  uint64_t joined_round = 0;   // the first round it is expected in
  double sec_per_step = 0;     // measured from its pushes; 0: unknown
};

}  // namespace

struct OuterServer::Impl final : proto::OuterSync::Service {
  ServerConfig cfg;
  int64_t period = 1;  // async Delayed Nesterov N
  TensorList spec;     // the parameters' names and shapes, without data (fixed)

  mutable std::mutex mu;
  std::condition_variable cv;
  // The global parameters as an immutable snapshot: a Pull streams one without holding the lock.
  std::shared_ptr<const TensorList> params;
  TensorList momentum, buffer;  // buffer: async only
  uint64_t version = 0;
  int64_t async_count = 0;   // pushes applied (async)
  int64_t total_steps = 0;   // inner steps pushed, summed
  int64_t accepted = 0;
  uint64_t next_id = 1;
  std::map<uint64_t, Member> members;
  // the open sync round
  TensorList round_sum;
  std::set<uint64_t> round_pushed;
  Clock::time_point first_push;  // of the open round

  std::unique_ptr<grpc::Server> server;
  std::thread sweeper;
  std::atomic<bool> stopping{false};

  Impl(ServerConfig c, TensorList initial) : cfg(std::move(c)) {
    if (cfg.token.empty()) throw Error("outer server: no token", "set LOOM_OUTER_TOKEN or [outer] token_file");
    if (cfg.inner_steps < 1) throw Error("outer server: [outer] inner_steps must be >= 1");
    if (!(cfg.lease_s > 0)) throw Error("outer server: [outer] lease_s must be > 0");
    period = cfg.delay > 0 ? cfg.delay : 1;
    for (const auto& t : initial) spec.push_back({t.name, t.shape, {}});
    momentum = zeros_like(initial);
    buffer = zeros_like(initial);
    round_sum = zeros_like(initial);
    if (!cfg.state_dir.empty() && fs::exists(state_file(cfg.state_dir))) {
      restore(initial);
    }
    params = std::make_shared<const TensorList>(std::move(initial));
  }

  // ---- state on disk ----

  void save_locked() {
    if (cfg.state_dir.empty()) return;
    std::vector<TensorToWrite> ts;
    auto add = [&](const std::string& prefix, const TensorList& l) {
      for (const auto& t : l) ts.push_back({prefix + t.name, DType::f32, t.shape, t.data.data()});
    };
    add("param.", *params);
    add("momentum.", momentum);
    if (cfg.mode == OuterMode::async) add("buffer.", buffer);
    nlohmann::json ms = nlohmann::json::array();
    for (const auto& [id, m] : members)
      ms.push_back({{"id", id}, {"name", m.name}, {"joined_round", m.joined_round},
                    {"sec_per_step", m.sec_per_step}});
    nlohmann::json meta{{"format", 1},          {"mode", train::outer_mode_name(cfg.mode)},
                        {"version", version},   {"async_count", async_count},
                        {"total_steps", total_steps}, {"next_id", next_id},
                        {"members", ms}};
    try {
      write_safetensors(state_file(cfg.state_dir), ts, {{"loom_outer", meta.dump()}});
    } catch (const Error& e) {
      // A version nobody can recover must not be served. The file on disk is the last good state
      // (the write is atomic); islands re-send what this server loses, once it is restarted.
      std::fprintf(stderr, "outer-server: error: cannot save the state at version %llu: %s\n"
                   "outer-server: stopping; the previous state is intact, restart once fixed\n",
                   (unsigned long long)version, e.what());
      std::_Exit(1);
    }
  }

  void restore(TensorList& initial) {
    const std::string path = state_file(cfg.state_dir);
    auto f = SafetensorsFile::open(path);
    auto it = f.metadata().find("loom_outer");
    if (it == f.metadata().end())
      throw Error(fmt::format("{}: not an outer server state (no loom_outer metadata)", path));
    nlohmann::json meta;
    try {
      meta = nlohmann::json::parse(it->second);
      if (meta.at("format").get<int>() != 1)
        throw Error(fmt::format("{}: unknown state format {}", path, meta.at("format").dump()));
      const std::string mode = train::outer_mode_name(cfg.mode);
      if (meta.at("mode").get<std::string>() != mode)
        throw Error(fmt::format("{}: the state is of a {} server, this one is {}", path,
                                meta.at("mode").get<std::string>(), mode),
                    "use another --state-dir, or the same [outer] mode");
      version = meta.at("version").get<uint64_t>();
      async_count = meta.at("async_count").get<int64_t>();
      total_steps = meta.at("total_steps").get<int64_t>();
      next_id = meta.at("next_id").get<uint64_t>();
      auto now = Clock::now();
      for (const auto& m : meta.at("members")) {
        Member mem{m.at("name").get<std::string>(), now + lease(), m.at("joined_round").get<uint64_t>(),
                   m.at("sec_per_step").get<double>()};
        members[m.at("id").get<uint64_t>()] = mem;
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: malformed loom_outer metadata: {}", path, e.what()));
    }
    auto load = [&](const std::string& prefix, TensorList& into) {
      for (auto& t : into) {
        const TensorView& v = f.get(prefix + t.name);
        if (v.dtype != DType::f32 || v.shape != t.shape)
          throw Error(fmt::format("{}: tensor '{}{}' is {}{}, the model's is f32{}", path, prefix, t.name,
                                  dtype_name(v.dtype), shape_str(v.shape), shape_str(t.shape)),
                      "this state belongs to another model: use another --state-dir");
        std::memcpy(t.data.data(), v.data, v.nbytes);
      }
    };
    load("param.", initial);
    load("momentum.", momentum);
    if (cfg.mode == OuterMode::async) load("buffer.", buffer);
    log(fmt::format("resumed from {}: version {}, {} members", path, version, members.size()));
  }

  // ---- helpers ----

  std::chrono::milliseconds lease() const {
    return std::chrono::milliseconds(int64_t(cfg.lease_s * 1000));
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
  // The member, its lease renewed; nullptr if there is no such (live) member.
  Member* touch_locked(uint64_t id) {
    auto it = members.find(id);
    if (it == members.end()) return nullptr;
    it->second.deadline = Clock::now() + lease();
    return &it->second;
  }
  Status not_member(uint64_t id) const {
    return Status(StatusCode::NOT_FOUND,
                  fmt::format("island {} is not a member (its lease expired, or it never joined): "
                              "join again", id));
  }
  bool done_locked() const { return cfg.step_budget > 0 && total_steps >= cfg.step_budget; }

  uint32_t inner_steps_for_locked(const Member& m) const {
    if (cfg.mode != OuterMode::async || m.sec_per_step <= 0) return uint32_t(cfg.inner_steps);
    double fastest = m.sec_per_step;
    for (const auto& [id, o] : members)
      if (o.sec_per_step > 0) fastest = std::min(fastest, o.sec_per_step);
    double h = std::round(double(cfg.inner_steps) * fastest / m.sec_per_step);
    return uint32_t(std::clamp<double>(h, 1, double(cfg.inner_steps)));
  }

  // Sync: closes the round when everyone expected has pushed. Returns true if it closed.
  bool maybe_close_locked() {
    if (cfg.mode != OuterMode::sync || round_pushed.empty()) return false;
    if (version == 0 && int64_t(round_pushed.size()) < cfg.min_islands &&
        Clock::now() < first_push + std::chrono::milliseconds(int64_t(cfg.start_grace_s * 1000)))
      return false;  // the start barrier
    for (const auto& [id, m] : members)
      if (m.joined_round <= version && !round_pushed.count(id)) return false;
    const float inv = 1.f / float(round_pushed.size());
    for (auto& t : round_sum)
      for (float& x : t.data) x *= inv;
    auto next = std::make_shared<TensorList>(*params);
    nesterov_step(cfg.opt, *next, momentum, round_sum);
    params = std::move(next);
    ++version;
    size_t n = round_pushed.size();
    round_pushed.clear();
    for (auto& t : round_sum) std::fill(t.data.begin(), t.data.end(), 0.f);
    save_locked();
    log(fmt::format("round {} closed: {} island(s) pushed, {} member(s)", version, n, members.size()));
    cv.notify_all();
    return true;
  }

  void sweep() {
    while (!stopping) {
      {
        std::lock_guard<std::mutex> lk(mu);
        auto now = Clock::now();
        for (auto it = members.begin(); it != members.end();) {
          if (it->second.deadline < now) {
            log(fmt::format("island {} ({}) dropped: lease expired", it->first, it->second.name));
            it = members.erase(it);
          } else {
            ++it;
          }
        }
        maybe_close_locked();  // a lease ran out, or the start barrier's grace did
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // ---- the calls ----

  Status Join(grpc::ServerContext* ctx, const proto::JoinRequest* req, proto::JoinReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::lock_guard<std::mutex> lk(mu);
    const TensorList& p = *params;
    if (size_t(req->model_size()) != p.size())
      return Status(StatusCode::FAILED_PRECONDITION,
                    fmt::format("the island's model has {} tensors, the server's {}",
                                req->model_size(), p.size()));
    for (size_t i = 0; i < p.size(); ++i) {
      const auto& m = req->model(int(i));
      std::vector<int64_t> shape(m.shape().begin(), m.shape().end());
      if (m.name() != p[i].name || shape != p[i].shape)
        return Status(StatusCode::FAILED_PRECONDITION,
                      fmt::format("the island's model differs from the server's: tensor {} is '{}' {} "
                                  "there, '{}' {} here", i, m.name(), shape_str(shape), p[i].name,
                                  shape_str(p[i].shape)));
    }
    uint64_t id = next_id++;
    Member m{req->name().substr(0, 200), Clock::now() + lease(),
             round_pushed.empty() || version == 0 ? version : version + 1, 0};
    members[id] = m;  // saved with the next round: a member lost in a restart simply joins again
    log(fmt::format("island {} ({}) joined at version {}", id, m.name, version));
    rep->set_island_id(id);
    rep->set_version(version);
    rep->set_inner_steps(uint32_t(cfg.inner_steps));
    rep->set_lease_ms(uint64_t(lease().count()));
    rep->set_mode(train::outer_mode_name(cfg.mode));
    rep->set_done(done_locked());
    return Status::OK;
  }

  Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                   proto::HeartbeatReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::lock_guard<std::mutex> lk(mu);
    if (!touch_locked(req->island_id())) return not_member(req->island_id());
    rep->set_version(version);
    rep->set_done(done_locked());
    return Status::OK;
  }

  Status Pull(grpc::ServerContext* ctx, const proto::PullRequest* req,
              grpc::ServerWriter<proto::PullReply>* w) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::shared_ptr<const TensorList> snap;
    uint64_t v;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!touch_locked(req->island_id())) return not_member(req->island_id());
      snap = params;
      v = version;
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
    const proto::PushHeader h = msg.header();
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!touch_locked(h.island_id())) return not_member(h.island_id());
    }
    if (h.inner_steps() < 1 || !std::isfinite(h.seconds()) || h.seconds() < 0)
      return Status(StatusCode::INVALID_ARGUMENT,
                    fmt::format("push header: inner_steps {} and seconds {} must be positive",
                                h.inner_steps(), h.seconds()));
    Assembler as(spec);
    bool first = true;
    do {
      if (!first && msg.has_header())
        return Status(StatusCode::INVALID_ARGUMENT, "a push carries one header, in its first message");
      first = false;
      if (msg.has_chunk()) {
        std::string err = as.add(msg.chunk());
        if (!err.empty()) return Status(StatusCode::INVALID_ARGUMENT, "push: " + err);
      }
    } while (rd->Read(&msg));
    if (std::string err = as.finish(); !err.empty())
      return Status(StatusCode::INVALID_ARGUMENT, "push: " + err);
    return apply(h, as.tensors(), rep);
  }

  Status apply(const proto::PushHeader& h, const TensorList& g, proto::PushReply* rep) {
    std::lock_guard<std::mutex> lk(mu);
    Member* m = touch_locked(h.island_id());
    if (!m) return not_member(h.island_id());
    if (h.base_version() > version)
      return Status(StatusCode::INVALID_ARGUMENT,
                    fmt::format("push for version {}, but the server is at {}", h.base_version(), version));
    if (cfg.mode == OuterMode::sync) {
      if (h.base_version() != version)
        return Status(StatusCode::FAILED_PRECONDITION,
                      fmt::format("stale push: made from version {}, the server is at {}: pull and go on",
                                  h.base_version(), version));
      if (round_pushed.count(h.island_id()))
        return Status(StatusCode::ALREADY_EXISTS,
                      fmt::format("island {} already pushed in round {}", h.island_id(), version + 1));
      for (size_t t = 0; t < g.size(); ++t) {
        float* s = round_sum[t].data.data();
        const float* x = g[t].data.data();
        for (size_t i = 0; i < g[t].data.size(); ++i) s[i] += x[i];
      }
      if (round_pushed.empty()) first_push = Clock::now();
      round_pushed.insert(h.island_id());
    } else {
      auto next = std::make_shared<TensorList>(*params);
      delayed_nesterov_push(cfg.opt, period, *next, momentum, buffer, async_count, g);
      params = std::move(next);
      ++version;
    }
    m->sec_per_step = h.seconds() / double(h.inner_steps());
    total_steps += int64_t(h.inner_steps());
    ++accepted;
    if (cfg.mode == OuterMode::sync) {
      maybe_close_locked();
    } else {
      save_locked();
      cv.notify_all();
    }
    rep->set_version(version);
    rep->set_inner_steps(inner_steps_for_locked(*m));
    rep->set_done(done_locked());
    return Status::OK;
  }

  Status Leave(grpc::ServerContext* ctx, const proto::LeaveRequest* req, proto::LeaveReply*) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::lock_guard<std::mutex> lk(mu);
    auto it = members.find(req->island_id());
    if (it == members.end()) return not_member(req->island_id());
    log(fmt::format("island {} ({}) left", it->first, it->second.name));
    members.erase(it);
    maybe_close_locked();
    return Status::OK;
  }

  Status Await(grpc::ServerContext* ctx, const proto::AwaitRequest* req,
               proto::AwaitReply* rep) override {
    if (Status s = check_token(ctx); !s.ok()) return s;
    std::unique_lock<std::mutex> lk(mu);
    if (!touch_locked(req->island_id())) return not_member(req->island_id());
    auto until = Clock::now() + std::chrono::milliseconds(std::min<uint32_t>(req->wait_ms(), 10000));
    cv.wait_until(lk, until, [&] { return version > req->base_version() || stopping; });
    if (!touch_locked(req->island_id())) return not_member(req->island_id());
    rep->set_version(version);
    rep->set_done(done_locked());
    if (version > req->base_version())
      rep->set_state(proto::AwaitReply::CLOSED);
    else if (!round_pushed.count(req->island_id()))
      rep->set_state(proto::AwaitReply::RESEND);
    else
      rep->set_state(proto::AwaitReply::PENDING);
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
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back({read_file(c.tls_key), read_file(c.tls_cert)});
    creds = grpc::SslServerCredentials(opts);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort(addr, creds, &port);
  b.RegisterService(impl_.get());
  b.SetMaxReceiveMessageSize(int(kChunkBytes) + (1 << 16));
  impl_->server = b.BuildAndStart();
  if (!impl_->server || port == 0)
    throw Error(fmt::format("outer server: cannot listen on {}", addr),
                "is the port in use? \"127.0.0.1:0\" picks a free one");
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
  return impl_->version;
}
TensorList OuterServer::params() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return *impl_->params;
}
size_t OuterServer::members() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->members.size();
}
int64_t OuterServer::pushes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->accepted;
}

TensorList read_state_params(const std::string& path, uint64_t* version) {
  auto f = SafetensorsFile::open(path);
  auto it = f.metadata().find("loom_outer");
  if (it == f.metadata().end())
    throw Error(fmt::format("{}: not an outer server state (no loom_outer metadata)", path));
  if (version) {
    try {
      *version = nlohmann::json::parse(it->second).at("version").get<uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: malformed loom_outer metadata: {}", path, e.what()));
    }
  }
  TensorList out;
  for (const auto& n : f.names()) {
    if (n.rfind("param.", 0) != 0) continue;
    const TensorView& v = f.get(n);
    if (v.dtype != DType::f32) throw Error(fmt::format("{}: tensor '{}' is not f32", path, n));
    Tensor t{n.substr(6), v.shape, std::vector<float>(v.nbytes / 4)};
    std::memcpy(t.data.data(), v.data, v.nbytes);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace loom::outer
