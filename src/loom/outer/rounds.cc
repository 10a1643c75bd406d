#include "loom/outer/rounds.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::outer {

namespace {

Refusal not_member(uint64_t id) {
  return {RefusalKind::not_member,
          fmt::format(
              "island {} is not a member (its lease expired, or it never joined): join again", id)};
}

}  // namespace

Rounds::Rounds(RoundsConfig cfg, TensorList initial, Hooks hooks)
    : cfg_(std::move(cfg)), hooks_(std::move(hooks)) {
  if (cfg_.inner_steps < 1) throw Error("outer server: [outer] inner_steps must be >= 1");
  if (!(cfg_.lease_s > 0)) throw Error("outer server: [outer] lease_s must be > 0");
  if (cfg_.mode == OuterMode::async && cfg_.fragments != 1)
    throw Error("outer server: [outer] fragments > 1 (streaming DiLoCo) needs mode = \"sync\"");
  if (!cfg_.modules.empty()) {
    if (cfg_.mode != OuterMode::sync || cfg_.fragments != 1)
      throw Error("outer server: [outer] modules (DiPaCo) needs mode = \"sync\" and fragments = 1");
    if (quantized(cfg_.update_encoding))
      throw Error("outer server: DiPaCo's islands pull f32 parameters, not quantised updates");
    for (const auto& t : initial) model_spec_.push_back({t.name, t.shape, {}, t.layer});
    paths_ = dipaco::layout(model_spec_, cfg_.modules);
    initial = dipaco::module_table(paths_, initial);
  }
  for (const auto& t : initial) spec_.push_back({t.name, t.shape, {}, t.layer});
  split_ = split_fragments(spec_, cfg_.fragments);
  for (const auto& which : split_) {
    frag_spec_.push_back(gather(spec_, which));
    frags_.push_back({0,
                      zeros_like(frag_spec_.back()),
                      std::vector<int64_t>(frag_spec_.back().size(), 0),
                      {},
                      {},
                      {}});
  }
  momentum_ = zeros_like(initial);
  buffer_ = zeros_like(initial);
  params_ = std::make_shared<const TensorList>(std::move(initial));
}

void Rounds::resume(OuterState saved, Time now) {
  params_ = std::make_shared<const TensorList>(std::move(saved.params));
  momentum_ = std::move(saved.momentum);
  buffer_ = std::move(saved.buffer);
  LOOM_CHECK(saved.meta.fragment_versions.size() == frags_.size())
      << "read_state checks the fragments";
  for (size_t f = 0; f < frags_.size(); ++f) {
    frags_[f].version = saved.meta.fragment_versions[f];
    frags_[f].pushed.clear();
    frags_[f].update.reset();
    for (auto& t : frags_[f].sum) std::fill(t.data.begin(), t.data.end(), 0.f);
    std::fill(frags_[f].count.begin(), frags_[f].count.end(), 0);
  }
  for (const auto& [id, r] : saved.meta.members)
    if (r.path >= std::max<size_t>(paths_.count(), 1))
      throw Error(
          fmt::format("outer state: member {} trains path {}, but the server's model has "
                      "{} path(s)",
                      id, r.path, std::max<size_t>(paths_.count(), 1)));
  async_count_ = saved.meta.async_count;
  periods_ = saved.meta.periods;
  period_pushers_.clear();  // lost: the open period closes at its N-th push
  total_steps_ = saved.meta.total_steps;
  next_id_ = saved.meta.next_id;
  keys_ = std::move(saved.meta.keys);
  members_.clear();
  for (auto& [id, r] : saved.meta.members) members_[id] = {std::move(r), now + lease()};
}

// ---- the calls ----

std::optional<Refusal> Rounds::join(const std::string& name, const TensorList& model, Time now,
                                    Joined* out, const std::string& key, uint32_t path) {
  // with modules, an island's model is a path: the model's names and shapes
  const TensorList& p = paths_.count() ? model_spec_ : spec_;
  if (model.size() != p.size())
    return Refusal{
        RefusalKind::other_model,
        fmt::format("the island's model has {} tensors, the server's {}", model.size(), p.size())};
  for (size_t i = 0; i < p.size(); ++i) {
    if (model[i].name != p[i].name || model[i].shape != p[i].shape)
      return Refusal{RefusalKind::other_model,
                     fmt::format("the island's model differs from the server's: tensor {} is '{}' "
                                 "{} there, '{}' {} here",
                                 i, model[i].name, shape_str(model[i].shape), p[i].name,
                                 shape_str(p[i].shape))};
  }
  if (const size_t n = std::max<size_t>(paths_.count(), 1); path >= n)
    return Refusal{
        RefusalKind::invalid,
        fmt::format("the island trains path {}, but the server's model has {} path(s)", path, n)};
  if (key.size() > kMaxKeyBytes)
    return Refusal{RefusalKind::invalid,
                   fmt::format("an island key of {} bytes: at most {}", key.size(), kMaxKeyBytes)};
  auto known = key.empty() ? keys_.end() : keys_.find(key);
  if (!key.empty() && known == keys_.end() && keys_.size() >= kMaxKeys)
    return Refusal{
        RefusalKind::invalid,
        fmt::format("the server keeps {} island keys already: join without one", kMaxKeys)};
  const bool again = known != keys_.end();
  const uint64_t id = again ? known->second : next_id_++;
  if (!key.empty()) keys_[key] = id;
  // Expected from the next round of each fragment whose round is under way (but every island is,
  // in the first); a restarted island's push of an open round, if the old process made one, still
  // counts.
  std::vector<uint64_t> joined;
  for (const Fragment& f : frags_)
    joined.push_back(f.pushed.empty() || f.version == 0 ? f.version : f.version + 1);
  Member& m =
      members_[id] = {{name.substr(0, kMaxNameBytes), std::move(joined), 0, path}, now + lease()};
  // saved with the next round: a member lost in a restart simply joins again
  log(fmt::format("island {} ({}) {} at version {}{}", id, m.record.name,
                  again ? "rejoined (the same island, restarted)" : "joined", version(),
                  paths_.count() ? " on path " + paths_.name(path) : ""));
  if (again) maybe_close(now);  // a round may have waited only for the old process
  *out = {id, version(), uint32_t(cfg_.inner_steps), done()};
  return std::nullopt;
}

std::optional<Refusal> Rounds::touch(uint64_t id, Time now) {
  if (!find_live(id, now)) return not_member(id);
  return std::nullopt;
}

std::optional<Refusal> Rounds::check_header(const PushInfo& h) const {
  if (h.inner_steps < 1 || !std::isfinite(h.seconds) || h.seconds < 0)
    return Refusal{RefusalKind::invalid,
                   fmt::format("push header: inner_steps {} and seconds {} must be positive",
                               h.inner_steps, h.seconds)};
  if (h.fragment >= fragments())
    return Refusal{RefusalKind::invalid,
                   fmt::format("push header: fragment {}, but the server's model has {}",
                               h.fragment, fragments())};
  return std::nullopt;
}

namespace {

// The first non-finite value of `ts`, as "tensor 'name' index i", or "" when all are finite.
std::string nonfinite_in(const TensorList& ts) {
  for (const auto& t : ts)
    if (const int64_t i = loom::first_nonfinite(t.data.data(), int64_t(t.data.size())); i >= 0)
      return fmt::format("tensor '{}' index {}", t.name, i);
  return "";
}

}  // namespace

std::optional<Refusal> Rounds::push(const PushInfo& h, const TensorList& grad, Time now,
                                    Pushed* out) {
  Member* m = find_live(h.island_id, now);
  if (!m) return not_member(h.island_id);
  if (auto r = check_header(h)) return r;
  Fragment& frag = frags_[h.fragment];
  uint64_t pushed_period = 0;  // async: the period the push is in
  // the server never commits a non-finite parameter: a push that would make one is refused
  if (const std::string bad = nonfinite_in(grad); !bad.empty())
    return Refusal{RefusalKind::invalid,
                   fmt::format("push from island {}: the pseudo-gradient is not finite at {}",
                               h.island_id, bad)};
  const std::string of = fragments() > 1 ? fmt::format(" of fragment {}", h.fragment) : "";
  if (h.base_version > frag.version)
    return Refusal{RefusalKind::invalid,
                   fmt::format("push for version {}{}, but the server is at {}", h.base_version, of,
                               frag.version)};
  if (cfg_.mode == OuterMode::sync) {
    if (h.base_version != frag.version)
      return Refusal{RefusalKind::stale,
                     fmt::format("stale push: made from version {}{}, the server is at {}: pull "
                                 "and go on",
                                 h.base_version, of, frag.version)};
    if (frag.pushed.count(h.island_id))
      return Refusal{RefusalKind::duplicate, fmt::format("island {} already pushed in round {}{}",
                                                         h.island_id, frag.version + 1, of)};
    // where each pushed tensor goes in the fragment: itself, or with modules its path's module's
    const std::vector<size_t>* path = paths_.count() ? &paths_.path[m->record.path] : nullptr;
    auto at = [&](size_t t) { return path ? (*path)[t] : t; };
    // checked before anything is added, so a refused push leaves the sum as it was
    for (size_t t = 0; t < grad.size(); ++t) {
      const float* s = frag.sum[at(t)].data.data();
      const float* x = grad[t].data.data();
      for (size_t i = 0; i < grad[t].data.size(); ++i)
        if (!std::isfinite(s[i] + x[i]))
          return Refusal{RefusalKind::invalid,
                         fmt::format("push from island {}: the round's sum would overflow at "
                                     "tensor '{}' index {} ({} + {})",
                                     h.island_id, grad[t].name, i, s[i], x[i])};
    }
    for (size_t t = 0; t < grad.size(); ++t) {
      float* s = frag.sum[at(t)].data.data();
      const float* x = grad[t].data.data();
      for (size_t i = 0; i < grad[t].data.size(); ++i) s[i] += x[i];
      ++frag.count[at(t)];
    }
    if (frag.pushed.empty()) frag.first_push = now;
    frag.pushed.insert(h.island_id);
    // one line per push of a round: what a restart finds lost (the island pushes it again)
    log(fmt::format("island {} ({}) pushed to round {}{}", h.island_id, m->record.name,
                    frag.version + 1, of));
  } else {  // one fragment: the whole model
    auto next = std::make_shared<TensorList>(*params_);
    TensorList momentum = momentum_, buffer = buffer_;
    int64_t count = async_count_;
    // the beat moved on without the rest of the open period (an island stalled or missed its
    // beat): it closes first, so a period stays one beat (with [outer] delay: only N pushes do)
    const bool early = cfg_.delay == 0 && count > 0 && period_pushers_.count(h.island_id);
    if (early) delayed_nesterov_close(cfg_.opt, period(), *next, momentum, buffer, count);
    delayed_nesterov_push(cfg_.opt, period(), *next, momentum, buffer, count, grad);
    auto update = quantize_update(*params_, *next);
    if (std::string bad = nonfinite_in(*next) + nonfinite_in(momentum); !bad.empty())
      return Refusal{RefusalKind::invalid,
                     fmt::format("push from island {}: the update would make a non-finite "
                                 "parameter or momentum ({}); not applied",
                                 h.island_id, bad)};
    momentum_ = std::move(momentum);
    buffer_ = std::move(buffer);
    async_count_ = count;
    params_ = std::move(next);
    ++frag.version;
    frag.update = std::move(update);
    if (early) {
      log(fmt::format("period {} closed with {} of {} pushes: island {} ({}) pushed again",
                      periods_ + 1, period_pushers_.size(), period(), h.island_id, m->record.name));
      ++periods_;
      period_pushers_.clear();
    }
    pushed_period = periods_ + 1;
    period_pushers_.insert(h.island_id);
    if (async_count_ == 0) {  // this push closed it
      ++periods_;
      period_pushers_.clear();
    }
  }
  if (m->pushes++ > 0) {
    m->steps += double(h.inner_steps);
    m->seconds += h.seconds;
    m->wall += std::chrono::duration<double>(now - m->last_push).count();
    if (m->pushes > 2) m->record.sec_per_step = m->seconds / m->steps;
  }
  m->last_push = now;
  total_steps_ += int64_t(h.inner_steps);
  ++accepted_;
  if (cfg_.mode == OuterMode::sync) {
    maybe_close(now);
  } else if (hooks_.on_version) {
    hooks_.on_version();
  }
  const Beat beat = beat_for(*m, now);
  *out = {frag.version,  beat.inner_steps,       beat.push_in_s, done(),
          pushed_period, uint64_t(total_steps_), speed_share(*m)};
  return std::nullopt;
}

std::optional<Refusal> Rounds::leave(uint64_t id, Time now) {
  auto it = members_.find(id);
  if (it == members_.end()) return not_member(id);
  log(fmt::format("island {} ({}) left", it->first, it->second.record.name));
  members_.erase(it);
  maybe_close(now);
  return std::nullopt;
}

void Rounds::expire(Time now) {
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.deadline < now) {
      log(fmt::format("island {} ({}) dropped: lease expired", it->first, it->second.record.name));
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
  maybe_close(now);  // a lease ran out, or the start barrier's grace did
}

// ---- what the calls see ----

RoundState Rounds::round_state(uint64_t id, uint32_t fragment, uint64_t base_version) const {
  const Fragment& f = frags_[fragment];
  if (f.version > base_version) return RoundState::closed;
  // async holds no rounds: an island awaits a version, and a lost push is simply lost
  if (cfg_.mode == OuterMode::async) return RoundState::pending;
  if (!f.pushed.count(id)) return RoundState::resend;
  return RoundState::pending;
}

std::string Rounds::awaited(uint32_t fragment, Time now) const {
  const Fragment& frag = frags_[fragment];
  if (cfg_.mode != OuterMode::sync || frag.pushed.empty()) return "";  // no round is open
  std::vector<std::string> missing;
  for (const auto& [id, m] : members_)
    if (m.record.joined[fragment] <= frag.version && !frag.pushed.count(id))
      missing.push_back(fmt::format("island {} ({})", id, m.record.name));
  std::string out = fmt::format("{}", fmt::join(missing, ", "));
  if (frag.version == 0 && int64_t(frag.pushed.size()) < cfg_.min_islands) {
    const double left =
        std::chrono::duration<double>(
            frag.first_push + std::chrono::milliseconds(int64_t(cfg_.start_grace_s * 1000)) - now)
            .count();
    if (left > 0)
      out += fmt::format(
          "{}{} more of the {} islands expected ([outer] islands; the first round "
          "closes without them in {:.1f} s)",
          out.empty() ? "" : "; and ", cfg_.min_islands - int64_t(frag.pushed.size()),
          cfg_.min_islands, left);
  }
  return out;
}

std::shared_ptr<const std::vector<proto::TensorChunk>> Rounds::update(uint32_t f,
                                                                      uint64_t from) const {
  const Fragment& frag = frags_[f];
  return frag.version == from + 1 ? frag.update : nullptr;
}

std::shared_ptr<const std::vector<proto::TensorChunk>> Rounds::quantize_update(
    const TensorList& old, TensorList& next) const {
  if (!quantized(cfg_.update_encoding)) return nullptr;
  TensorList delta = next;
  for (size_t t = 0; t < delta.size(); ++t)
    for (size_t i = 0; i < delta[t].data.size(); ++i) delta[t].data[i] -= old[t].data[i];
  // a non-finite next makes a non-finite delta (the caller refuses it); a finite next can too, by
  // overflow: then no update is kept, and islands pull the parameters whole
  if (!nonfinite_in(delta).empty()) return nullptr;
  Encoded e = encode(delta, cfg_.update_encoding);
  // what an island computes from the chunks: old + decoded, in f32, element by element
  for (size_t t = 0; t < next.size(); ++t)
    for (size_t i = 0; i < next[t].data.size(); ++i)
      next[t].data[i] = old[t].data[i] + e.decoded[t].data[i];
  return std::make_shared<const std::vector<proto::TensorChunk>>(std::move(e.chunks));
}

TensorList Rounds::pulled(const TensorList& params, uint32_t f, uint32_t path) const {
  if (paths_.count()) return dipaco::path_view(paths_, path, params, model_spec_);
  return fragments() > 1 ? gather(params, split_[f]) : params;
}

std::optional<uint32_t> Rounds::path_of(uint64_t id) const {
  auto it = members_.find(id);
  if (it == members_.end()) return std::nullopt;
  return it->second.record.path;
}

uint64_t Rounds::version() const {
  uint64_t v = 0;
  for (const Fragment& f : frags_) v += f.version;
  return v;
}

int64_t Rounds::period() const {
  if (cfg_.delay > 0) return cfg_.delay;
  return std::max<int64_t>(1, int64_t(members_.size()));
}

bool Rounds::done() const { return cfg_.step_budget > 0 && total_steps_ >= cfg_.step_budget; }

std::chrono::milliseconds Rounds::lease() const {
  return std::chrono::milliseconds(int64_t(cfg_.lease_s * 1000));
}

StateMeta Rounds::meta() const {
  StateMeta s{cfg_.mode, version(), {}, async_count_, periods_, total_steps_, next_id_, {}, keys_};
  for (const Fragment& f : frags_) s.fragment_versions.push_back(f.version);
  for (const auto& [id, m] : members_) s.members[id] = m.record;
  return s;
}

// ---- helpers ----

Rounds::Member* Rounds::find_live(uint64_t id, Time now) {
  auto it = members_.find(id);
  if (it == members_.end()) return nullptr;
  it->second.deadline = now + lease();
  return &it->second;
}

// Async: the seconds to the beat the island's next push falls on (rounds.h), and the steps that
// is at its own speed; H (and no beat) until its speed is known.
Rounds::Beat Rounds::beat_for(const Member& m, Time now) {
  const double own = m.record.sec_per_step;
  if (cfg_.mode != OuterMode::async || own <= 0) return {uint32_t(cfg_.inner_steps), 0};
  const Member* fastest = &m;
  for (const auto& [id, o] : members_)
    if (o.record.sec_per_step > 0 && o.record.sec_per_step < fastest->record.sec_per_step)
      fastest = &o;
  // wall time per second of steps (evaluation, logging, the outer calls), the fastest island's
  const double over =
      fastest->seconds > 0 ? std::clamp(fastest->wall / fastest->seconds, 1.0, 3.0) : 1.0;
  const double beat = double(cfg_.inner_steps) * fastest->record.sec_per_step * over;
  // the first beat at least half a beat away; the grid moves on from its last beat by the beat's
  // length now (a new speed moves the beats to come, never the one the islands are heading for)
  if (!beat_) beat_ = now;
  if (const double behind = std::chrono::duration<double>(now - *beat_).count() + beat / 2;
      behind > 0)
    *beat_ += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::ceil(behind / beat) * beat));
  const double in = std::chrono::duration<double>(*beat_ - now).count();
  const double h = std::round(in / (own * over));
  return {uint32_t(std::clamp<double>(h, 1, 2 * double(cfg_.inner_steps))), in};
}

double Rounds::speed_share(const Member& m) const {
  const double own = m.record.sec_per_step;
  if (own <= 0) return double(members_.size());
  double share = 0;
  for (const auto& [id, o] : members_)
    share += o.record.sec_per_step > 0 ? own / o.record.sec_per_step : 1;
  return share;
}

void Rounds::maybe_close(Time now) {
  if (cfg_.mode != OuterMode::sync) return;
  for (uint32_t f = 0; f < fragments(); ++f) close(f, now);
}

void Rounds::close(uint32_t f, Time now) {
  Fragment& frag = frags_[f];
  if (frag.pushed.empty()) return;
  if (frag.version == 0 && int64_t(frag.pushed.size()) < cfg_.min_islands &&
      now < frag.first_push + std::chrono::milliseconds(int64_t(cfg_.start_grace_s * 1000)))
    return;  // the start barrier
  for (const auto& [id, m] : members_)
    if (m.record.joined[f] <= frag.version && !frag.pushed.count(id)) return;
  // each tensor's mean over the pushes that carried it (all of them, but with modules); a tensor
  // none carried (a module on no path that pushed) keeps its parameters and momentum
  std::vector<size_t> carried, which;  // positions in the fragment; indices in spec_
  for (size_t k = 0; k < frag.sum.size(); ++k) {
    if (frag.count[k] == 0) continue;
    const float inv = 1.f / float(frag.count[k]);
    for (float& x : frag.sum[k].data) x *= inv;
    carried.push_back(k);
    which.push_back(split_[f][k]);
  }
  auto next = std::make_shared<TensorList>(*params_);
  const TensorList old = gather(*next, which);
  TensorList p = old, momentum = gather(momentum_, which);
  nesterov_step(cfg_.opt, p, momentum, gather(frag.sum, carried));
  auto update = quantize_update(old, p);
  const size_t n = frag.pushed.size();
  frag.pushed.clear();
  for (auto& t : frag.sum) std::fill(t.data.begin(), t.data.end(), 0.f);
  std::fill(frag.count.begin(), frag.count.end(), 0);
  const std::string of = fragments() > 1 ? fmt::format(" of fragment {}", f) : "";
  if (std::string bad = nonfinite_in(p) + nonfinite_in(momentum); !bad.empty()) {
    // never committed (nor saved): the round is dropped, its islands push again from this version
    log(
        fmt::format("round {}{} discarded: its update would make a non-finite parameter or "
                    "momentum ({})",
                    frag.version + 1, of, bad));
    return;
  }
  scatter(p, which, *next);
  scatter(momentum, which, momentum_);
  params_ = std::move(next);
  ++frag.version;
  frag.update = std::move(update);
  if (hooks_.on_version) hooks_.on_version();
  log(fmt::format("round {}{} closed: {} island(s) pushed, {} member(s)", frag.version, of, n,
                  members_.size()));
}

void Rounds::log(const std::string& s) const {
  if (hooks_.log) hooks_.log(s);
}

}  // namespace loom::outer
