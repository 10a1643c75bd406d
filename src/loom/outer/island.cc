#include "loom/outer/island.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::outer {

using Clock = std::chrono::steady_clock;

std::string read_token(const train::OuterConfig& c, const std::string& config_path) {
  if (!c.token_file.empty()) {
    std::string t;
    try {
      t = read_file(c.token_file);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: [outer] token_file: {}", config_path, e.what()));
    }
    while (!t.empty() && std::isspace(uint8_t(t.back()))) t.pop_back();
    while (!t.empty() && std::isspace(uint8_t(t.front()))) t.erase(t.begin());
    if (t.empty()) throw Error(fmt::format("[outer] token_file {} is empty", c.token_file));
    return t;
  }
  if (const char* e = std::getenv("LOOM_OUTER_TOKEN"); e && *e) return e;
  throw Error(fmt::format("{}: the outer sync service needs a shared token", config_path),
              "set the LOOM_OUTER_TOKEN environment variable, or [outer] token_file to a file "
              "holding it (never the command line)");
}

Island::Island(const train::Config& cfg, train::ParamStore& params, const std::string& name,
               const std::string& key)
    : cfg_(cfg.outer), params_(params), name_(name), key_(key) {
  TensorList spec;  // names and shapes
  for (const auto& p : params.infos()) spec.push_back({p.name, p.shape, {}});
  global_ = zeros_like(spec);
  client_ =
      std::make_unique<OuterClient>(ClientConfig{cfg.outer.server, read_token(cfg.outer, cfg.path),
                                                 cfg.outer.tls_ca, cfg.outer.retry_s},
                                    std::move(spec));
  join();
  pull();
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

Island::~Island() {
  client_->leave(id_);  // best effort: else the server drops this island when its lease runs out
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Island::join() {
  proto::JoinReply r;
  grpc::Status s = client_->join(name_, &r, key_);
  if (!s.ok())
    throw Error(fmt::format("outer server {} refused to let this island join: {}",
                            client_->server(), s.error_message()));
  if (r.mode() != train::outer_mode_name(cfg_.mode))
    throw Error(fmt::format("outer server {} runs in {} mode, but [outer] mode = \"{}\"",
                            client_->server(), r.mode(), train::outer_mode_name(cfg_.mode)));
  id_ = r.island_id();
  version_ = r.version();
  h_ = int64_t(r.inner_steps());
  lease_ms_ = r.lease_ms();
  done_ = r.done();
  fmt::print(stderr, "island {}: joined {} at version {} (H = {})\n", id_.load(), client_->server(),
             version_, h_);
}

void Island::pull() {
  for (int attempt = 0;; ++attempt) {
    grpc::Status s = client_->pull(id_, global_, &version_);
    if (s.ok()) break;
    if (s.error_code() == grpc::StatusCode::NOT_FOUND && attempt < 3) {
      join();
      continue;
    }
    throw Error(
        fmt::format("outer server {}: pull failed: {}", client_->server(), s.error_message()));
  }
  for (const auto& t : global_) std::memcpy(params_.data(t.name), t.data.data(), t.data.size() * 4);
}

void Island::heartbeat_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(std::max<uint64_t>(lease_ms_ / 4, 10)));
    if (stop_) break;
    lk.unlock();
    proto::HeartbeatReply r;
    client_->heartbeat(id_, &r);  // failures are seen (and handled) by the next real call
    lk.lock();
  }
}

std::optional<proto::AwaitReply::State> Island::await(uint64_t base_version, uint32_t wait_ms,
                                                      const std::string& what) {
  proto::AwaitReply a;
  grpc::Status s = client_->await(id_, base_version, wait_ms, &a);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    join();
    return std::nullopt;
  }
  if (!s.ok())
    throw Error(fmt::format("outer server {}: waiting for {}: {}", client_->server(), what,
                            s.error_message()));
  done_ = a.done();
  return a.state();
}

bool Island::sync(int64_t steps, double seconds) {
  auto t0 = Clock::now();
  TensorList g = global_;
  for (auto& t : g) {
    const float* local = params_.data(t.name);
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] -= local[i];
  }
  proto::PushHeader h;
  h.set_island_id(id_);
  h.set_base_version(version_);
  h.set_inner_steps(uint32_t(std::max<int64_t>(steps, 1)));
  h.set_seconds(seconds);
  const proto::Encoding enc = cfg_.compress == "bf16"   ? proto::BF16
                              : cfg_.compress == "int8" ? proto::INT8
                              : cfg_.compress == "int4" ? proto::INT4
                                                        : proto::F32;
  const std::string server = client_->server();
  // async: the version after this push, and the one that closes its Delayed Nesterov period
  uint64_t pushed_version = 0, period_version = 0;
  // Pushes; returns true if the push stands (accepted, or already held by the server).
  auto push = [&]() {
    proto::PushReply rep;
    grpc::Status s = client_->push(h, g, enc, &rep);
    switch (s.error_code()) {
      case grpc::StatusCode::OK:
        h_ = int64_t(rep.inner_steps());
        done_ = rep.done();
        pushed_version = rep.version();
        period_version = rep.period_version();
        return true;
      case grpc::StatusCode::ALREADY_EXISTS:
        return true;
      case grpc::StatusCode::NOT_FOUND:
        fmt::print(stderr, "island {}: dropped by the server ({}); joining again\n", id_.load(),
                   s.error_message());
        join();
        return false;
      case grpc::StatusCode::FAILED_PRECONDITION:
        fmt::print(stderr, "island {}: {}\n", id_.load(), s.error_message());
        return false;
      default:
        throw Error(fmt::format("outer server {} rejected a push: {}", server, s.error_message()));
    }
  };
  const bool pushed = push();
  if (pushed && cfg_.mode == train::OuterMode::async && cfg_.grace > 0 &&
      period_version > pushed_version) {
    // Wait, at most `grace` of this round's time, for the other pushes of this Delayed Nesterov
    // period: islands that push together then all start from the period's parameters (its
    // momentum step included), as DiLoCo's do, instead of each from a different part-update. An
    // island slower than the grace only costs the others that wait.
    const auto until = Clock::now() + std::chrono::duration<double>(cfg_.grace * seconds);
    while (Clock::now() < until) {
      const double left_ms =
          std::chrono::duration<double, std::milli>(until - Clock::now()).count();
      const auto st = await(period_version - 1, uint32_t(std::clamp(left_ms, 1.0, 1000.0)),
                            fmt::format("version {}", period_version));
      if (!st || *st == proto::AwaitReply::CLOSED) break;
    }
  }
  if (pushed && cfg_.mode == train::OuterMode::sync) {
    for (;;) {
      const auto st = await(h.base_version(), 1000, fmt::format("round {}", h.base_version() + 1));
      if (!st || *st == proto::AwaitReply::CLOSED) break;
      if (*st == proto::AwaitReply::RESEND) {
        fmt::print(stderr,
                   "island {}: the server holds no push of ours for round {} (it "
                   "restarted?): pushing again\n",
                   id_.load(), h.base_version() + 1);
        if (!push()) break;
      }
    }
  }
  pull();
  ++rounds_;
  wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return !done_;
}

}  // namespace loom::outer
