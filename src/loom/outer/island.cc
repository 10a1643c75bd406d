#include "loom/outer/island.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/outer/model_tensors.h"
#include "loom/outer/yield.h"

namespace loom::outer {

using Clock = std::chrono::steady_clock;

std::string read_token(const OuterConfig& c, const std::string& config_path) {
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
  TensorList spec = model_tensors(params, false);  // names, shapes, layers
  split_ = split_fragments(spec, cfg.outer.fragments);
  for (const auto& which : split_) global_.push_back(zeros_like(gather(spec, which)));
  versions_.assign(split_.size(), 0);
  held_.assign(split_.size(), false);
  since_.assign(split_.size(), 0);
  client_ =
      std::make_unique<OuterClient>(ClientConfig{cfg.outer.server, read_token(cfg.outer, cfg.path),
                                                 cfg.outer.tls_ca, cfg.outer.retry_s},
                                    std::move(spec));
  join();
  pull_all();
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  if (cfg_.mode == OuterMode::async && cfg_.yield && !can_idle())
    fmt::print(stderr,
               "island {}: [outer] yield: this process may not leave idle CPU priority (it needs "
               "CAP_SYS_NICE, or an RLIMIT_NICE of at least 20 - its nice value): its steps "
               "ahead of a period run at normal priority\n",
               id_.load());
}

Island::~Island() {
  if (idle_) restore_compute();  // a step that threw
  if (catch_up_.valid()) {       // a push's thread still awaiting its period
    stop_awaiting_ = true;
    client_->cancel_await();
    try {
      catch_up_.get();
    } catch (const std::exception&) {  // the server is gone: nothing to tell it
    }
  }
  client_->leave(id_);  // best effort: else the server drops this island when its lease runs out
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Island::join() {
  ahead_steps_ = 0;  // a (re)joining island takes the current parameters, no period
  proto::JoinReply r;
  grpc::Status s = client_->join(name_, &r, key_, uint32_t(split_.size()),
                                 uint32_t(cfg_.dipaco.paths()), uint32_t(cfg_.dipaco.path));
  if (!s.ok())
    throw Error(fmt::format("outer server {} refused to let this island join: {}",
                            client_->server(), s.error_message()));
  if (r.mode() != outer_mode_name(cfg_.mode))
    throw Error(fmt::format("outer server {} runs in {} mode, but [outer] mode = \"{}\"",
                            client_->server(), r.mode(), outer_mode_name(cfg_.mode)));
  if (const uint32_t f = std::max<uint32_t>(r.fragments(), 1); f != split_.size())
    throw Error(
        fmt::format("outer server {} splits the model into {} fragment(s), but [outer] "
                    "fragments = {}",
                    client_->server(), f, split_.size()));
  if (int64_t(r.paths()) != cfg_.dipaco.paths())
    throw Error(fmt::format("outer server {} has {} DiPaCo path(s), but [outer] modules make {}",
                            client_->server(), r.paths(), cfg_.dipaco.paths()));
  id_ = r.island_id();
  h_ = int64_t(r.inner_steps());
  lease_ms_ = r.lease_ms();
  if (r.done()) done_ = true;
  rejoined_ = true;
  fmt::print(
      stderr, "island {}: joined {} at version {} (H = {}{}{})\n", id_.load(), client_->server(),
      r.version(), h_, split_.size() > 1 ? fmt::format(", {} fragments", split_.size()) : "",
      cfg_.dipaco.paths() ? fmt::format(", path {} of {}", cfg_.dipaco.path, cfg_.dipaco.paths())
                          : "");
}

int64_t Island::inner_steps() const {
  int64_t due = push_bound();
  if (const double left = steps_to_beat(); left < std::numeric_limits<double>::infinity())
    due = std::min(due, t_ + std::max<int64_t>(1, int64_t(left / 2)));
  if (in_flight_) due = std::min(due, in_flight_->land_at);
  if (catch_up_.valid()) due = std::min(due, t_ + 1);
  return std::max<int64_t>(1, due - t_);
}

train::ScheduleClock Island::clock() const {
  train::ScheduleClock c = clock_;
  c.now = t_;
  return c;
}

uint64_t Island::version() const {
  uint64_t v = 0;
  for (uint64_t x : versions_) v += x;
  return v;
}

void Island::fetch(uint32_t f) {
  for (int attempt = 0;; ++attempt) {
    // an update (quantised, from the version held) once global_[f] holds a version's parameters
    const bool update = held_[f] && quantized(encoding_of(cfg_.compress));
    grpc::Status s = client_->pull(id_, f, global_[f], &versions_[f], update);
    if (s.ok()) {
      held_[f] = true;
      break;
    }
    if (s.error_code() == grpc::StatusCode::NOT_FOUND && attempt < 3) {
      join();
      continue;
    }
    throw Error(
        fmt::format("outer server {}: pull failed: {}", client_->server(), s.error_message()));
  }
}

void Island::pull(uint32_t f, double mix) {
  fetch(f);
  touch(true);
  const float a = float(mix), b = float(1 - mix);
  for (const auto& t : global_[f]) {
    float* local = params_.data(t.name);
    if (mix == 0) {
      std::memcpy(local, t.data.data(), t.data.size() * 4);
    } else {
      for (size_t i = 0; i < t.data.size(); ++i) local[i] = a * local[i] + b * t.data[i];
    }
  }
}

void Island::pull_all() {
  // a join during the pulls (dropped again) starts them over, at most 3 times
  for (int i = 0; rejoined_ && i < 3; ++i) {
    rejoined_ = false;
    for (uint32_t f = 0; f < split_.size(); ++f) pull(f, 0);
  }
  in_flight_.reset();
  if (cfg_.mode == OuterMode::async) {
    base_ = global_[0];
    caught_up_ = true;
  }
  std::fill(since_.begin(), since_.end(), 0);
  // the cycle goes on at the fragment whose round closes next: the first of the lowest version
  next_ = uint32_t(std::min_element(versions_.begin(), versions_.end()) - versions_.begin());
  next_push_ = t_ + std::max<int64_t>(1, h_ / int64_t(split_.size()));
  seconds_ = 0;
}

void Island::heartbeat_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    // a quarter of the lease, at most a second (the reply also says when the budget is spent)
    cv_.wait_for(lk, std::chrono::milliseconds(std::clamp<uint64_t>(lease_ms_ / 4, 10, 1000)));
    if (stop_) break;
    lk.unlock();
    proto::HeartbeatReply r;
    // failures are seen (and handled) by the next real call; a spent budget stops the loop soon
    if (client_->heartbeat(id_, &r).ok() && r.done()) done_ = true;
    lk.lock();
  }
}

std::optional<proto::AwaitReply::State> Island::await(uint32_t f, uint64_t base_version,
                                                      uint32_t wait_ms, const std::string& what,
                                                      std::string* awaited) {
  proto::AwaitReply a;
  grpc::Status s = client_->await(id_, f, base_version, wait_ms, &a);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    join();
    return std::nullopt;
  }
  if (!s.ok())
    throw Error(fmt::format("outer server {}: waiting for {}: {}", client_->server(), what,
                            s.error_message()));
  if (a.done()) done_ = true;
  if (awaited) *awaited = a.awaited();
  return a.state();
}

Island::InFlight Island::push(uint32_t f, double seconds) {
  InFlight fl;
  fl.fragment = f;
  fl.base_version = versions_[f];
  fl.steps = std::max<int64_t>(since_[f], 1);
  fl.seconds = seconds;
  fl.land_at = t_ + cfg_.overlap;
  auto grad = std::make_shared<TensorList>(global_[f]);
  touch(false);
  for (auto& t : *grad) {
    const float* local = params_.data(t.name);
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] -= local[i];
  }
  fl.grad = std::move(grad);
  since_[f] = 0;
  send(fl);
  return fl;
}

void Island::send(InFlight& fl) {
  proto::PushHeader h;
  h.set_island_id(id_);
  h.set_base_version(fl.base_version);
  h.set_inner_steps(uint32_t(std::min<int64_t>(fl.steps, UINT32_MAX)));
  h.set_seconds(fl.seconds);
  h.set_fragment(fl.fragment);
  const proto::Encoding enc = encoding_of(cfg_.compress);
  // one push at a time: the client's byte count before and after is this push's
  fl.sending = std::async(std::launch::async, [this, h, enc, grad = fl.grad] {
    Sent out;
    const uint64_t before = client_->bytes_sent();
    out.status = client_->push(h, *grad, enc, &out.reply);
    out.bytes = client_->bytes_sent() - before;
    return out;
  });
}

bool Island::sent(InFlight& fl) {
  Sent r = fl.sending.get();  // a loom::Error of the push (the server gone for good) throws here
  fl.bytes += r.bytes;
  return answered(r);
}

bool Island::answered(const Sent& r) {
  const grpc::Status& s = r.status;
  const proto::PushReply& rep = r.reply;
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
      h_ = int64_t(rep.inner_steps());
      if (rep.done()) done_ = true;
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
      throw Error(
          fmt::format("outer server {} rejected a push: {}", client_->server(), s.error_message()));
  }
}

void Island::land(InFlight& fl, double mix, bool counted) {
  const uint32_t f = fl.fragment;
  fl.stands = sent(fl);
  const std::string round = split_.size() > 1
                                ? fmt::format("round {} of fragment {}", fl.base_version + 1, f)
                                : fmt::format("round {}", fl.base_version + 1);
  if (fl.stands) {
    // a round that keeps this island waiting says, now and then, for whom (a member that holds
    // its lease but never pushes, islands expected that never come)
    const auto since = Clock::now();
    double told_s = 0;
    for (;;) {
      std::string awaited;
      const auto st = await(f, fl.base_version, 1000, round, &awaited);
      if (!st || *st == proto::AwaitReply::CLOSED) break;
      const double waited_s = seconds_since(since);
      if (*st == proto::AwaitReply::PENDING && waited_s >= std::max(10.0, 3 * told_s)) {
        fmt::print(stderr, "island {}: {} has waited {:.0f} s for {}\n", id_.load(), round,
                   waited_s, awaited.empty() ? "the server" : awaited);
        told_s = waited_s;
      }
      if (*st == proto::AwaitReply::RESEND) {
        fmt::print(stderr,
                   "island {}: the server holds no push of ours for {} (it restarted?): pushing "
                   "again\n",
                   id_.load(), round);
        send(fl);
        if (!(fl.stands = sent(fl))) break;
      }
    }
  }
  if (rejoined_) return;  // dropped and joined again: sync() pulls everything
  const uint64_t before = client_->bytes_received();
  pull(f, mix);
  if (fl.stands) ++rounds_;
  if (counted)
    peak_round_bytes_ =
        std::max(peak_round_bytes_, fl.bytes + (client_->bytes_received() - before));
}

bool Island::sync(int64_t steps, double seconds, bool last) {
  auto t0 = Clock::now();
  t_ += steps;
  seconds_ += seconds;
  for (int64_t& s : since_) s += steps;
  const int64_t rounds_before = rounds_;
  if (cfg_.mode == OuterMode::async)
    async_sync(last);
  else
    sync_rounds(last);
  if (rejoined_) pull_all();
  const auto now = Clock::now();
  const double waited = std::chrono::duration<double>(now - t0).count();
  wait_s_ += waited;
  round_wait_s_ += waited;
  if (rounds_ > rounds_before) {  // a round ended in this call
    const double span = std::chrono::duration<double>(now - round_start_).count();
    round_wait_share_ = span > 0 ? round_wait_s_ / span : 0;
    round_wait_s_ = 0;
    round_start_ = now;
  }
  return !done_;
}

void Island::compute(bool begins) {
  // a push's thread in flight: the island is ahead of that push's period until it takes it
  if (begins && catch_up_.valid() && cfg_.yield && set_compute_idle()) {
    idle_ = true;
    ++yield_steps_;
  } else if (!begins && idle_) {
    idle_ = false;
    restore_compute();
  }
}

void Island::sync_rounds(bool last) {
  const int64_t n = int64_t(split_.size());
  // at the last step every round is taken whole (mix 0), and none counts toward the peak
  const double mix = last ? 0 : cfg_.mix;
  if (in_flight_ && (t_ >= in_flight_->land_at || last)) {
    land(*in_flight_, mix, !last);
    in_flight_.reset();
  }
  if (!rejoined_ && t_ >= next_push_) {
    InFlight fl = push(next_, seconds_);
    seconds_ = 0;
    next_ = uint32_t((next_ + 1) % n);
    if (cfg_.overlap > 0 && !last)
      in_flight_ = std::move(fl);
    else
      land(fl, mix, !last);
    next_push_ = t_ + std::max<int64_t>(1, h_ / n);
  }
  // the final flush: every fragment trained since its last push, in the cycle's order
  for (int64_t k = 0; last && k < n && !rejoined_; ++k) {
    const uint32_t f = uint32_t((next_ + k) % n);
    if (since_[f] == 0) continue;
    InFlight fl = push(f, seconds_);
    seconds_ = 0;
    land(fl, 0, false);
  }
}

// ---- async ----

int64_t Island::push_bound() const {
  const int64_t h = beat_h_;
  return h > 0 ? pushed_at_ + 2 * h : next_push_;
}

double Island::steps_to_beat() const {
  const int64_t beat = beat_at_;
  if (beat == 0) return std::numeric_limits<double>::infinity();
  // the pace of the round under way, else of the last
  const auto now = Clock::now();
  const double pace = t_ > pushed_at_ ? std::chrono::duration<double>(now - pushed_wall_).count() /
                                            double(t_ - pushed_at_)
                                      : step_wall_s_;
  if (pace <= 0) return std::numeric_limits<double>::infinity();
  const Clock::duration to_beat(beat - now.time_since_epoch().count());
  return std::chrono::duration<double>(to_beat).count() / pace;
}

void Island::async_sync(bool last) {
  // due at the step that ends nearest to the beat, or after push_bound()'s steps
  const bool due = last || t_ >= push_bound() || steps_to_beat() <= 0.5;
  if (catch_up_.valid() &&
      (due || catch_up_.wait_for(std::chrono::seconds(0)) == std::future_status::ready))
    take_catch_up();
  if (rejoined_ || !due) return;
  // the period of the last push has not closed (it waits on a slower island): no waiting for it,
  // the newest version instead
  if (!caught_up_) take_newest();
  if (rejoined_) return;
  peak_round_bytes_ = std::max(peak_round_bytes_, round_bytes_);
  round_bytes_ = 0;
  async_push(seconds_);
  seconds_ = 0;
  if (!last) return;
  // the run's end: the push answered, and the newest parameters taken whole
  take_catch_up();
  if (!rejoined_ && !caught_up_) take_newest();
}

void Island::async_push(double seconds) {
  proto::PushHeader h;
  h.set_island_id(id_);
  h.set_base_version(versions_[0]);
  h.set_inner_steps(uint32_t(std::clamp<int64_t>(since_[0], 1, UINT32_MAX)));
  h.set_seconds(seconds);
  h.set_fragment(0);
  // the pseudo-gradient base - local; the base moves to local (what is pushed is the server's now)
  auto grad = std::make_shared<TensorList>(base_);
  touch(false);
  for (size_t k = 0; k < grad->size(); ++k) {
    Tensor& g = (*grad)[k];
    float* b = base_[k].data.data();
    const float* local = params_.data(g.name);
    for (size_t i = 0; i < g.data.size(); ++i) {
      g.data[i] -= local[i];
      b[i] = local[i];
    }
  }
  const auto now = Clock::now();
  if (t_ > pushed_at_ && pushed_at_ > 0)
    step_wall_s_ =
        std::chrono::duration<double>(now - pushed_wall_).count() / double(t_ - pushed_at_);
  since_[0] = 0;
  pushed_at_ = t_;
  pushed_wall_ = now;
  beat_at_ = 0;
  beat_h_ = 0;
  next_push_ = t_ + std::max<int64_t>(1, h_);  // until the reply says the next H
  caught_up_ = false;
  const proto::Encoding enc = encoding_of(cfg_.compress);
  // the pull is the quantised update from the version held, when global_[0] holds one: the thread
  // holds global_[0] (and its version) until the island takes the thread, and gives it back
  const bool update = held_[0] && quantized(enc);
  CatchUp start;
  start.params = std::move(global_[0]);
  start.version = versions_[0];
  stop_awaiting_ = false;
  const bool paced = step_wall_s_ > 0;  // the island knows its pace: it can keep to a beat
  catch_up_ = std::async(std::launch::async, [this, h, enc, grad = std::move(grad), update, paced,
                                              c = std::move(start)]() mutable {
    const uint64_t sent = client_->bytes_sent();
    c.push.status = client_->push(h, *grad, enc, &c.push.reply);
    if (const double in = c.push.reply.push_in_s(); c.push.status.ok() && in > 0 && paced) {
      beat_h_ = std::max<int64_t>(1, c.push.reply.inner_steps());  // before the beat: see sync()
      beat_at_ = (Clock::now() +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(in)))
                     .time_since_epoch()
                     .count();
    }
    c.push.bytes = client_->bytes_sent() - sent;
    if (!c.push.status.ok()) return std::move(c);
    if (c.push.reply.done()) done_ = true;          // seen by sync() at once
    const uint64_t period = c.push.reply.period();  // >= 1: it follows a push
    for (;;) {
      proto::AwaitReply a;
      // the server answers as soon as the version moves; take_catch_up cancels the wait
      c.wait = client_->await(id_, 0, 0, 1000, &a, &stop_awaiting_, period);
      if (stop_awaiting_) {
        c.wait = grpc::Status::OK;  // stopped, not failed
        return std::move(c);
      }
      if (!c.wait.ok()) return std::move(c);
      if (a.done()) done_ = true;
      if (a.state() == proto::AwaitReply::CLOSED) break;
    }
    const uint64_t received = client_->bytes_received();
    c.wait = client_->pull(id_, 0, c.params, &c.version, update);
    c.pulled = c.wait.ok();
    c.pull_bytes = client_->bytes_received() - received;
    return std::move(c);
  });
}

void Island::take_catch_up() {
  if (catch_up_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    stop_awaiting_ = true;
    client_->cancel_await();
  }
  // a loom::Error of the push or the pull (the server gone for good) throws here
  CatchUp c = catch_up_.get();
  stop_awaiting_ = false;
  global_[0] = std::move(c.params);  // the period's parameters when pulled, else as they were
  versions_[0] = c.version;
  round_bytes_ += c.push.bytes + c.pull_bytes;
  if (!answered(c.push)) return;  // dropped and joined again (or refused): sync() pulls all
  ++rounds_;
  if (cfg_.islands > 0) {
    const double n = double(cfg_.islands);
    clock_ = {true, double(c.push.reply.steps_pushed()) / n, c.push.reply.speed_share() / n,
              pushed_at_, 0};
  }
  next_push_ = pushed_at_ + std::max<int64_t>(1, h_);  // H as the reply set it
  if (c.wait.error_code() == grpc::StatusCode::NOT_FOUND) {
    join();
    return;
  }
  if (!c.wait.ok())
    throw Error(fmt::format("outer server {}: taking the parameters of a push's period: {}",
                            client_->server(), c.wait.error_message()));
  if (c.pulled) {
    held_[0] = true;
    rebase();
  }
}

void Island::take_newest() {
  const uint64_t received = client_->bytes_received();
  fetch(0);
  round_bytes_ += client_->bytes_received() - received;
  if (!rejoined_) rebase();
}

void Island::rebase() {
  ahead_steps_ = t_ - pushed_at_;
  touch(true);
  for (size_t k = 0; k < global_[0].size(); ++k) {
    const Tensor& g = global_[0][k];
    float* b = base_[k].data.data();
    float* local = params_.data(g.name);
    for (size_t i = 0; i < g.data.size(); ++i) {
      local[i] += g.data[i] - b[i];
      b[i] = g.data[i];
    }
  }
  caught_up_ = true;
}

double Island::wait_share() const {
  const double wall = seconds_since(made_);
  return wall > 0 ? wait_s_ / wall : 0;
}

}  // namespace loom::outer
