#include "loom/outer/service.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::outer {

namespace fs = std::filesystem;
using Clock = Rounds::Clock;
using grpc::Status;
using grpc::StatusCode;

namespace {

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

// A call naming a fragment the server's model does not have; none when it has it.
std::optional<Status> no_such_fragment(const char* call, uint32_t f, uint32_t fragments) {
  if (f < fragments) return std::nullopt;
  return Status(StatusCode::INVALID_ARGUMENT,
                fmt::format("{} fragment {}, but the server's model has {}", call, f, fragments));
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

OuterService::OuterService(ServerConfig cfg, TensorList initial)
    : cfg_(with_token(std::move(cfg))),
      rounds_(cfg_, std::move(initial),
              {[this](const std::string& s) { log(s); },
               [this] {
                 save_locked();
                 cv_.notify_all();
               }}) {
  const std::string path = state_file(cfg_.state_dir);
  if (!cfg_.state_dir.empty() && path_exists(path)) {
    rounds_.resume(read_state(path, cfg_.mode, rounds_.spec(), cfg_.fragments), Clock::now());
    log(fmt::format("resumed from {}: version {}, {} members", path, rounds_.version(),
                    rounds_.members()));
  }
}

bool OuterService::token_matches(const std::string& got) const {
  // compares without returning early at the first differing byte
  const std::string want = "Bearer " + cfg_.token;
  if (got.size() != want.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < got.size(); ++i) d |= uint8_t(got[i]) ^ uint8_t(want[i]);
  return d == 0;
}

void OuterService::save_locked() {
  if (cfg_.state_dir.empty()) return;
  try {
    write_state(state_file(cfg_.state_dir), rounds_.meta(), *rounds_.params(), rounds_.momentum(),
                rounds_.buffer());
  } catch (const Error& e) {
    // A version nobody can recover must not be served. The file on disk is the last good state
    // (the write is atomic); islands re-send what this server loses, once it is restarted.
    std::fprintf(stderr,
                 "outer-server: error: cannot save the state at version %llu: %s\n"
                 "outer-server: stopping; the previous state is intact, restart once fixed\n",
                 (unsigned long long)rounds_.version(), e.what());
    std::_Exit(1);
  }
}

void OuterService::save() {
  std::lock_guard<std::mutex> lk(mu_);
  save_locked();
}

void OuterService::log(const std::string& s) const {
  if (cfg_.verbose) fmt::print(stderr, "outer-server: {}\n", s);
}

void OuterService::expire() {
  std::lock_guard<std::mutex> lk(mu_);
  rounds_.expire(Clock::now());
}

void OuterService::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

// ---- the calls ----

Status OuterService::join(const proto::JoinRequest& req, proto::JoinReply* rep) {
  if (const uint32_t f = std::max<uint32_t>(req.fragments(), 1); f != rounds_.fragments())
    return Status(
        StatusCode::FAILED_PRECONDITION,
        fmt::format("the island splits the model into {} fragment(s), the server into {}: "
                    "set the same [outer] fragments",
                    f, rounds_.fragments()));
  if (req.paths() != rounds_.paths().count())
    return Status(StatusCode::FAILED_PRECONDITION,
                  fmt::format("the island's [outer] modules make {} path(s), the server's {}: set "
                              "the same [outer] modules (none: not DiPaCo)",
                              req.paths(), rounds_.paths().count()));
  TensorList model;
  for (const auto& m : req.model())
    model.push_back({m.name(), std::vector<int64_t>(m.shape().begin(), m.shape().end()), {}});
  std::lock_guard<std::mutex> lk(mu_);
  Rounds::Joined j;
  if (auto r = rounds_.join(req.name(), model, Clock::now(), &j, req.key(), req.path()))
    return refused(*r);
  rep->set_island_id(j.island_id);
  rep->set_version(j.version);
  rep->set_inner_steps(j.inner_steps);
  rep->set_lease_ms(uint64_t(rounds_.lease().count()));
  rep->set_mode(outer_mode_name(cfg_.mode));
  rep->set_done(j.done);
  rep->set_fragments(rounds_.fragments());
  rep->set_paths(uint32_t(rounds_.paths().count()));
  return Status::OK;
}

Status OuterService::heartbeat(const proto::HeartbeatRequest& req, proto::HeartbeatReply* rep) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto r = rounds_.touch(req.island_id(), Clock::now())) return refused(*r);
  rep->set_version(rounds_.version());
  rep->set_done(rounds_.done());
  return Status::OK;
}

Status OuterService::pull(const proto::PullRequest& req,
                          const std::function<bool(const proto::PullReply&)>& write) {
  // the fragments are fixed: no lock
  if (auto bad = no_such_fragment("pull of", req.fragment(), rounds_.fragments())) return *bad;
  std::shared_ptr<const TensorList> snap;
  std::shared_ptr<const std::vector<proto::TensorChunk>> update;
  uint64_t v;
  uint32_t path = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto r = rounds_.touch(req.island_id(), Clock::now())) return refused(*r);
    path = *rounds_.path_of(req.island_id());
    snap = rounds_.params();
    v = rounds_.version(req.fragment());
    if (req.want_update()) update = rounds_.update(req.fragment(), req.have_version());
  }
  if (update) {  // the quantised update from the island's version
    proto::PullReply head;
    head.set_version(v);
    head.set_update(true);
    if (!write(head)) return Status(StatusCode::CANCELLED, "the island went away");
    proto::PullReply r;
    for (const proto::TensorChunk& c : *update) {
      *r.mutable_chunk() = c;
      if (!write(r)) return Status(StatusCode::CANCELLED, "the island went away");
    }
    return Status::OK;
  }
  if (rounds_.fragments() > 1 || rounds_.paths().count())  // the fragment's or path's tensors
    snap = std::make_shared<const TensorList>(rounds_.pulled(*snap, req.fragment(), path));
  proto::PullReply head;
  head.set_version(v);
  if (!write(head)) return Status(StatusCode::CANCELLED, "the island went away");
  proto::PullReply r;
  bool ok = for_each_chunk(*snap, proto::F32, [&](proto::TensorChunk& c) {
    r.mutable_chunk()->Swap(&c);
    return write(r);
  });
  return ok ? Status::OK : Status(StatusCode::CANCELLED, "the island went away");
}

Status OuterService::push(const std::function<bool(proto::PushRequest&)>& read,
                          proto::PushReply* rep) {
  proto::PushRequest msg;
  if (!read(msg) || !msg.has_header())
    return Status(StatusCode::INVALID_ARGUMENT, "a push must start with its header");
  const PushInfo h{msg.header().island_id(), msg.header().base_version(),
                   msg.header().inner_steps(), msg.header().seconds(), msg.header().fragment()};
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto r = rounds_.touch(h.island_id, Clock::now())) return refused(*r);
    // one push in flight per island: each holds a model-sized buffer while it streams, so an
    // island cannot make the server hold more than one (100 header-only pushes made it 18x)
    if (!pushing_.insert(h.island_id).second)
      return Status(
          StatusCode::RESOURCE_EXHAUSTED,
          fmt::format("island {} already has a push in flight: one at a time", h.island_id));
  }
  struct Done {
    OuterService* s;
    uint64_t id;
    ~Done() {
      std::lock_guard<std::mutex> lk(s->mu_);
      s->pushing_.erase(id);
    }
  } done{this, h.island_id};
  if (auto r = rounds_.check_header(h)) return refused(*r);  // reads what is fixed: no lock
  Assembler as(rounds_.push_spec(h.fragment));               // fixed too
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
  } while (read(msg));
  if (std::string err = as.finish(); !err.empty())
    return Status(StatusCode::INVALID_ARGUMENT, "push: " + err);
  std::lock_guard<std::mutex> lk(mu_);
  Rounds::Pushed p;
  if (auto r = rounds_.push(h, as.tensors(), Clock::now(), &p)) return refused(*r);
  rep->set_version(p.version);
  rep->set_inner_steps(p.inner_steps);
  rep->set_push_in_s(p.push_in_s);
  rep->set_done(p.done);
  rep->set_period(p.period);
  rep->set_steps_pushed(p.steps_pushed);
  rep->set_speed_share(p.speed_share);
  return Status::OK;
}

Status OuterService::leave(const proto::LeaveRequest& req, proto::LeaveReply*) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto r = rounds_.leave(req.island_id(), Clock::now())) return refused(*r);
  return Status::OK;
}

Status OuterService::await(const proto::AwaitRequest& req, proto::AwaitReply* rep) {
  const uint32_t f = req.fragment();
  if (auto bad = no_such_fragment("await on", f, rounds_.fragments())) return *bad;  // no lock
  std::unique_lock<std::mutex> lk(mu_);
  if (auto r = rounds_.touch(req.island_id(), Clock::now())) return refused(*r);
  auto until = Clock::now() + std::chrono::milliseconds(std::min<uint32_t>(req.wait_ms(), 10000));
  const uint64_t period = req.period();  // async: a period's close
  auto closed = [&] {
    return period > 0 ? rounds_.periods() >= period : rounds_.version(f) > req.base_version();
  };
  cv_.wait_until(lk, until, [&] { return closed() || stopping_; });
  if (auto r = rounds_.touch(req.island_id(), Clock::now())) return refused(*r);
  rep->set_version(rounds_.version(f));
  rep->set_done(rounds_.done());
  rep->set_state(period > 0
                     ? closed() ? proto::AwaitReply::CLOSED : proto::AwaitReply::PENDING
                     : await_state(rounds_.round_state(req.island_id(), f, req.base_version())));
  if (rep->state() == proto::AwaitReply::PENDING)
    rep->set_awaited(rounds_.awaited(f, Clock::now()));
  return Status::OK;
}

uint64_t OuterService::version() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rounds_.version();
}
TensorList OuterService::params() const {
  std::lock_guard<std::mutex> lk(mu_);
  return *rounds_.params();
}
size_t OuterService::members() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rounds_.members();
}
int64_t OuterService::pushes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rounds_.pushes();
}

}  // namespace loom::outer
