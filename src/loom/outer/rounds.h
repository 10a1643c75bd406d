// The outer server's logic: membership and leases, sync rounds, async pushes (Delayed Nesterov) and
// each island's H. Every call says what time it is, so a test drives leases and the start barrier
// with a clock of its own; the server passes steady_clock::now().
//
// Membership: join gives an island an id and a lease; every call by a member renews it; expire()
// drops members whose lease ran out (no round waits for them again: they must join afresh), leave()
// drops one at once. An island joining while a round has pushes is expected from the next round
// on (its push still counts in the current one if it arrives in time); before the first round
// closes every island that joins is expected in it.
//
// Sync: a push must be made from the current version (else `stale`), once per island per round
// (else `duplicate`). A round closes when every live member expected in it has pushed; the outer
// Nesterov step is taken on the mean. With `min_islands` > 0 the first round also waits for that
// many pushes, or `start_grace_s` after its first push (the start barrier).
// Streaming (sync, `fragments` > 1): the model falls into fragments (fragments.h), each with
// rounds, a version and expected members of its own, exactly as the whole model has with one
// fragment; a push carries one fragment's tensors. version() is the sum of the fragments' versions.
// DiPaCo (sync, `modules` set: dipaco/paths.h): the server holds the module table, every member
// trains one path and pushes that path's tensors (the model's names and order); a round closes when
// every expected member has pushed, and each tensor of the table takes the mean of the pushes that
// carried it (a module's outer gradient averaged over the paths through it that pushed); a module
// no push carried keeps its parameters and momentum. A member pulls its path's tensors.
// Async: each push is applied at once with Delayed Nesterov (optimizer.h), whatever its base
// version. The push's reply says when the island's next push falls due, on the beat: a clock of
// period H x the fastest island's wall seconds per step, from the first reply set from a speed;
// the reply names the next beat at least half a beat away (push_in_s) and H, the steps that is at
// the island's own speed (its seconds per step from its pushes, times the fastest's wall time per
// second of steps; in [1, 2H]), and the island pushes at the step that ends nearest to the beat.
// So a k-times slower island takes about H / k steps (Liu et al.'s dynamic local updates), and
// islands whose pushes drift apart (scheduling noise, an evaluation, a stall) push together again
// from the next beat. The clock moves on from its last beat by the beat's length at each reply, so
// a new speed moves the beats to come, never the one the islands head for. A Delayed Nesterov
// period is one beat: it closes at its N-th push, or (N the live members) when an island of it
// pushes again, the beat having moved on without the rest; it then closes first, as if the
// missing pushes were zero.
// Both: a push from a future version is `invalid`; `done` once the inner steps pushed reach
// `step_budget`.
//
// Not here: the network, tokens and chunk decoding (server.cc, tensors.h), locking (a Rounds is
// used under one lock), the state file's format (state_file.h), when the state is written (the
// `on_version` hook).
//
// Invariant: a refused call changes nothing but the caller's lease; the version moves only when a
// round closes (sync) or a push is applied (async), and `on_version` runs before the call that
// moved it returns, so no caller sees a version the hook has not seen.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "loom/dipaco/paths.h"
#include "loom/outer/fragments.h"
#include "loom/outer/optimizer.h"
#include "loom/outer/state_file.h"
#include "loom/outer/tensors.h"

namespace loom::outer {

struct RoundsConfig {
  OuterMode mode = OuterMode::sync;
  OuterOptConfig opt;
  int64_t inner_steps = 50;      // H
  int64_t fragments = 1;         // sync: streaming DiLoCo's fragments (fragments.h)
  std::vector<int64_t> modules;  // sync: DiPaCo's modules per level (dipaco/paths.h); empty: none
  // INT8, INT4: every update of the global parameters is committed as its quantised encoding
  // decodes, and kept, so an island one version behind pulls the update in that encoding
  proto::Encoding update_encoding = proto::F32;
  int64_t delay = 0;        // async: Delayed Nesterov period N; 0: the live members
  int64_t step_budget = 0;  // async: inner steps, summed over pushes, after which islands stop
  double lease_s = 10;
  int64_t min_islands = 0;    // sync: pushes the first round waits for ([outer] islands)
  double start_grace_s = 60;  // ... at most this long after its first push
};

// Why a call was refused; the server maps each kind to a gRPC status code.
enum class RefusalKind {
  not_member,   // unknown id, or its lease expired: join again
  other_model,  // a join with other tensor names or shapes
  invalid,      // a malformed push header, or a push from a future version
  stale,        // sync: a push made from an older version
  duplicate,    // sync: a second push by one island in one round
};
struct Refusal {
  RefusalKind kind;
  std::string message;
};

// What a push says about itself (the header of a Push call).
struct PushInfo {
  uint64_t island_id = 0;
  uint64_t base_version = 0;  // the version its inner steps started from
  uint32_t inner_steps = 0;   // inner steps taken since then
  double seconds = 0;         // wall time they took
  uint32_t fragment = 0;      // whose tensors it carries (and whose version base_version is)
};

// A sync island's round, as Await reports it.
enum class RoundState {
  pending,  // not closed yet
  closed,   // the version moved past the round's base
  resend,   // no push from the island in the open round (the server restarted): push again
};

class Rounds {
 public:
  using Clock = std::chrono::steady_clock;
  using Time = Clock::time_point;

  struct Hooks {
    std::function<void(const std::string&)> log;  // a line per round and membership change
    std::function<void()> on_version;             // the version moved: persist it
  };
  struct Joined {
    uint64_t island_id = 0;
    uint64_t version = 0;
    uint32_t inner_steps = 0;
    bool done = false;
  };
  struct Pushed {
    uint64_t version = 0;      // after the push (async: it includes the push)
    uint32_t inner_steps = 0;  // H for the island's next round
    // async, once the island's speed is known: seconds from now to the beat its next push falls
    // on (the island pushes at the step that ends nearest to it, H its estimate); 0: none
    double push_in_s = 0;
    bool done = false;
    // async: the Delayed Nesterov period this push is in (1, 2, ...; periods() reaches it when
    // the period has closed: its momentum step is in the parameters); sync: 0
    uint64_t period = 0;
    // async: the inner steps pushed in all (this push included), and the live members' summed
    // speed over this island's (a member whose speed is not known yet counts as this island; 1
    // per member when none is known): the schedule's shared clock (island.h)
    uint64_t steps_pushed = 0;
    double speed_share = 1;
  };

  // Version 0 at `initial` (the model's tensors; with modules, every module of the table starts as
  // the model's), with no members. Throws loom::Error on a bad config.
  Rounds(RoundsConfig cfg, TensorList initial, Hooks hooks = {});

  // Takes up a saved state (state_file.h, read for this config's mode and fragments): the tensors
  // carry the model's names and shapes, and every member gets a fresh lease from `now`. The rounds
  // in flight when it was saved are lost.
  void resume(OuterState saved, Time now);

  // ---- the calls, each at time `now` ----

  // `model`: the island's tensor names and shapes (no data), which must be the server's. `key`:
  // the island's identity across restarts (JoinRequest.key); a key seen before gets its island's
  // id back, and a round under way stops waiting for the old process (the island is expected from
  // the next round, as one joining mid-round is). At most kMaxKeys keys of kMaxKeyBytes.
  // `path`: the DiPaCo path it trains (0 without modules).
  std::optional<Refusal> join(const std::string& name, const TensorList& model, Time now,
                              Joined* out, const std::string& key = "", uint32_t path = 0);
  // Renews the member's lease; `not_member` if there is no such live member.
  std::optional<Refusal> touch(uint64_t id, Time now);
  // A push's header, checked before its tensors are read; reads nothing a call changes.
  std::optional<Refusal> check_header(const PushInfo& h) const;
  // `grad`: the checked pseudo-gradient of the header's fragment, in the order and shapes of
  // push_spec(h.fragment) (with modules: the island's path).
  std::optional<Refusal> push(const PushInfo& h, const TensorList& grad, Time now, Pushed* out);
  std::optional<Refusal> leave(uint64_t id, Time now);
  // Drops the members whose lease ran out and closes the round if nobody else is awaited (or the
  // start barrier's grace is over).
  void expire(Time now);

  // ---- what the calls see ----

  RoundState round_state(uint64_t id, uint32_t fragment, uint64_t base_version) const;
  // Sync: whom fragment f's open round waits for, in words ("island 3 (b), island 4 (c)", or the
  // start barrier's count and how long it has left); empty when it waits for no one.
  std::string awaited(uint32_t fragment, Time now) const;
  uint64_t version() const;  // summed over the fragments
  uint64_t version(uint32_t fragment) const { return frags_[fragment].version; }
  bool done() const;
  // The global parameters: an immutable snapshot, to be read without the lock.
  std::shared_ptr<const TensorList> params() const { return params_; }
  // The quantised update that took fragment f from version `from` to its current version (its
  // chunks, in fragment_spec(f)'s order: current = from + their decoding, bit for bit); null
  // when there is none (the fragment is not at from + 1, or updates are not quantised).
  std::shared_ptr<const std::vector<proto::TensorChunk>> update(uint32_t f, uint64_t from) const;
  // The parameters' names and shapes, without data; fixed, so it may be read without the lock.
  const TensorList& spec() const { return spec_; }
  // ... a fragment's (its tensors' indices in spec()), and how many there are; fixed too.
  uint32_t fragments() const { return uint32_t(frag_spec_.size()); }
  const TensorList& fragment_spec(uint32_t f) const { return frag_spec_[f]; }
  const std::vector<size_t>& fragment_tensors(uint32_t f) const { return split_[f]; }
  // What a push of fragment f carries, and a pull returns: fragment_spec(f), or with modules the
  // model's names and shapes (any path's). Fixed.
  const TensorList& push_spec(uint32_t f) const {
    return paths_.count() ? model_spec_ : frag_spec_[f];
  }
  // ... taken from `params` (a snapshot of params()) for a member of `path`. Fixed too.
  TensorList pulled(const TensorList& params, uint32_t f, uint32_t path) const;
  // The DiPaCo layout (count() 0 without modules); fixed.
  const dipaco::Paths& paths() const { return paths_; }
  // A live member's path (0 without modules); none if no such member.
  std::optional<uint32_t> path_of(uint64_t id) const;
  size_t members() const { return members_.size(); }
  int64_t pushes() const { return accepted_; }   // accepted since start
  uint64_t periods() const { return periods_; }  // async: Delayed Nesterov periods closed
  std::chrono::milliseconds lease() const;
  const RoundsConfig& config() const { return cfg_; }

  // What the state file keeps (state_file.h).
  StateMeta meta() const;
  const TensorList& momentum() const { return momentum_; }
  const TensorList& buffer() const { return buffer_; }

 private:
  struct Member {
    MemberRecord record;  // record.joined: a first round per fragment
    Time deadline;
    // what its pushes said, summed since it joined (or the server started), its first push left
    // out (that round holds the warm-up: the first steps allocate and fault in memory):
    // record.sec_per_step is their ratio, a mean that one noisy round barely moves, known once
    // two rounds are in it
    int64_t pushes = 0;
    double steps = 0, seconds = 0;
    double wall = 0;  // ... and the wall time from its push before to each (async's beat)
    Time last_push;
  };

  Member* find_live(uint64_t id, Time now);  // its lease renewed; nullptr if none
  // Async: H and the seconds to the beat the island's next push falls on (rounds.h's top).
  struct Beat {
    uint32_t inner_steps = 0;
    double push_in_s = 0;
  };
  Beat beat_for(const Member& m, Time now);
  double speed_share(const Member& m) const;
  // sync: closes each fragment's round that everyone expected in it has pushed
  void maybe_close(Time now);
  void close(uint32_t f, Time now);  // ... fragment f's, if so
  void log(const std::string& s) const;

  // A fragment's version and (sync) its open round.
  struct Fragment {
    uint64_t version = 0;        // rounds closed (sync), pushes applied (async, one fragment)
    TensorList sum;              // the pushes of the open round, summed, in fragment_spec's order
    std::vector<int64_t> count;  // ... how many pushes carried each tensor
    std::set<uint64_t> pushed;
    Time first_push;
    // the quantised update to `version` (update_encoding), null when none
    std::shared_ptr<const std::vector<proto::TensorChunk>> update;
  };
  // With quantised updates: `next` (the fragment's new parameters) <- old + the decoding of the
  // quantised next - old; returns its chunks (null without quantised updates).
  std::shared_ptr<const std::vector<proto::TensorChunk>> quantize_update(const TensorList& old,
                                                                         TensorList& next) const;

  RoundsConfig cfg_;
  Hooks hooks_;
  int64_t period() const;  // async Delayed Nesterov N: [outer] delay, or the live members
  TensorList spec_;
  Fragments split_;                    // fragment -> its tensors' indices in spec_
  std::vector<TensorList> frag_spec_;  // fragment -> its tensors' names and shapes
  std::vector<Fragment> frags_;
  dipaco::Paths paths_;    // DiPaCo: the module table's layout
  TensorList model_spec_;  // DiPaCo: the model's names and shapes (what a path is)
  std::shared_ptr<const TensorList> params_;
  TensorList momentum_, buffer_;       // buffer: async only
  int64_t async_count_ = 0;            // async: pushes in the open Delayed Nesterov period
  uint64_t periods_ = 0;               // async: periods closed
  std::set<uint64_t> period_pushers_;  // async: who pushed in the open period
  std::optional<Time> beat_;           // async: the beat the islands head for (the grid's last)
  int64_t total_steps_ = 0;            // inner steps pushed, summed
  int64_t accepted_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Member> members_;
  std::map<std::string, uint64_t> keys_;  // island key -> id
};

}  // namespace loom::outer
