// The outer server's state on disk: STATE_DIR/outer_state.safetensors, written after every round
// (sync) or push (async) and read back by a restarted server.
//
// Format (version 1): a safetensors file whose tensors are the global parameters "param.<name>",
// the outer momentum "momentum.<name>" and, in async mode only, the Delayed Nesterov buffer
// "buffer.<name>", all f32 in the model's order; its "loom_outer" metadata entry is JSON:
//   {"format": 1, "mode": "sync", "version": 12, "async_count": 0, "total_steps": 600,
//    "next_id": 4,   (async also "periods": the Delayed Nesterov periods closed; 0 if absent)
//    "members": [{"id": 1, "name": "host-a", "joined_round": 0, "sec_per_step": 0.2}]}
// With streaming fragments (F > 1) "version" is the sum of "fragment_versions" (one per fragment)
// and each member's "joined_round" is a list, a first round per fragment. With DiPaCo's modules the
// tensors are the module table's (dipaco/paths.h) and each member has its "path" (written when not
// 0). Leases are not kept: a restarted server gives every member a fresh one.
//
// Not here: when the state is written, or what a failed write does to the server (server.cc); the
// rounds themselves (rounds.h).
//
// Invariant: a write is atomic (write_safetensors renames a complete file into place), so the file
// always holds the last state written whole; a read either returns a state that fits the model and
// the mode in full, or throws loom::Error naming the file (and the tensor) with nothing half-loaded
// that a caller would keep.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/outer/config_section.h"
#include "loom/outer/tensors.h"

namespace loom::outer {

// A member as the state file keeps it.
struct MemberRecord {
  std::string name;
  // the first round it is expected in, per fragment (one: the whole model)
  std::vector<uint64_t> joined = {0};
  double sec_per_step = 0;  // measured from its pushes; 0: unknown
  uint32_t path = 0;        // DiPaCo: the path it trains
};

// The bounds on island keys a server keeps (a hostile island could otherwise make it remember
// keys without end): bytes per key, and keys.
constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxKeys = 65536;
// ... and on a member's name (a join's longer name is cut to it).
constexpr size_t kMaxNameBytes = 200;

// Everything in the state file but the tensors.
struct StateMeta {
  OuterMode mode = OuterMode::sync;
  uint64_t version = 0;                     // summed over the fragments
  std::vector<uint64_t> fragment_versions;  // one per fragment
  int64_t async_count = 0;                  // async: pushes in the open Delayed Nesterov period
  uint64_t periods = 0;                     // async: Delayed Nesterov periods closed
  int64_t total_steps = 0;                  // inner steps pushed, summed
  uint64_t next_id = 1;                     // the id the next island to join gets
  std::map<uint64_t, MemberRecord> members;
  std::map<std::string, uint64_t> keys;  // an island's key (JoinRequest.key) -> its id
};

// The state file's name inside a state directory.
std::string state_file(const std::string& state_dir);

// Writes the state atomically; `buffer` only in async mode. Throws loom::Error naming the file.
void write_state(const std::string& path, const StateMeta& meta, const TensorList& params,
                 const TensorList& momentum, const TensorList& buffer);

// A state as read back.
struct OuterState {
  StateMeta meta;
  TensorList params, momentum, buffer;  // buffer: zeros in sync mode
};

// Reads a state written for a server of `mode` and `fragments` whose model has the names and shapes
// of `spec`. Throws loom::Error naming the file: not a state, an unknown format, another mode or
// number of fragments, a tensor of another model.
OuterState read_state(const std::string& path, OuterMode mode, const TensorList& spec,
                      int64_t fragments = 1);

// The global parameters as the file holds them (whatever the model), and the version.
TensorList read_state_params(const std::string& path, uint64_t* version = nullptr);

}  // namespace loom::outer
