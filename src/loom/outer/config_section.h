// [outer]: the island's side of DiLoCo / asynchronous Local-SGD (this room), and the settings
// `loom outer-server` reads from the same file. Empty `server`: no outer loop. Streaming DiLoCo's
// keys are here (fragments.h); DiPaCo's are its room's (dipaco/config_section.h), read into
// `dipaco`.
#pragma once

#include <cstdint>
#include <string>

#include "loom/config/fwd.h"
#include "loom/dipaco/config_section.h"

namespace loom::outer {

// [outer] mode: how the outer server applies pushes (rounds.h). sync: in rounds that close when
// every expected island has pushed; async: each push at once (Delayed Nesterov).
enum class OuterMode { sync, async };
// "sync" | "async": the one spelling in configs, on the wire (JoinReply.mode) and in state files.
const char* outer_mode_name(OuterMode m);

struct OuterConfig {
  std::string server;  // host:port of loom outer-server
  OuterMode mode = OuterMode::sync;
  int64_t inner_steps = 50;  // H: inner steps between pushes
  double lr = 0.7;           // outer Nesterov learning rate
  double momentum = 0.9;
  std::string compress = "f32";  // pseudo-gradients pushed as "f32", "bf16", "int8" or "int4"
  // sync, streaming DiLoCo (fragments.h): the model's fragments, each synced every H steps at
  // staggered offsets; an island goes on `overlap` inner steps after pushing a fragment before it
  // takes the round's result, which it mixes in as mix x local + (1 - mix) x global
  int64_t fragments = 1;
  int64_t overlap = 0;
  double mix = 0;
  // sync, DiPaCo (dipaco/paths.h): modules per level (none: not DiPaCo), this island's path, the
  // router
  dipaco::PathsConfig dipaco;
  int64_t delay = 0;    // async: Delayed Nesterov period; 0: the live islands
  int64_t islands = 0;  // islands expected (async step budget = islands x [train] steps)
  // async: from a push until it takes its period, the island's inner steps run at idle CPU
  // priority (yield.h)
  bool yield = true;
  double lease_s = 10;
  double retry_s = 120;    // how long an island keeps reconnecting to a server that is gone
  std::string token_file;  // else the LOOM_OUTER_TOKEN environment variable
  std::string tls_ca;      // island: PEM to trust; server: tls_cert + tls_key
  std::string tls_cert, tls_key;
};

// Its check: streaming needs sync mode, fragments divide inner_steps, overlap under a fragment's
// period; DiPaCo needs sync, one fragment, no overlap (and dipaco::check_paths).
const config::Section<OuterConfig>& outer_section();

}  // namespace loom::outer
