// DiPaCo's keys of [outer] (docs/outer.md#dipaco): the modules per level, the path an island
// trains, and the router directory `loom dipaco route` wrote. They are read into OuterConfig's
// `dipaco` (outer/config_section.h); their rules that involve no other key are `check_paths`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/fwd.h"

namespace loom::dipaco {

// The most paths a layout may have (the server keeps a module table and the islands a path each).
constexpr int64_t kMaxPaths = 4096;

struct PathsConfig {
  std::vector<int64_t> modules;  // modules per level; empty: not DiPaCo
  int64_t path = 0;              // the path this island trains
  std::string router;            // the directory `loom dipaco route` wrote
  // the product of `modules`; 0 without
  int64_t paths() const {
    if (modules.empty()) return 0;
    int64_t n = 1;
    for (int64_t m : modules) n *= m;
    return n;
  }
  bool enabled() const { return !modules.empty(); }
};

// `modules`, `path`, `router`, as keys of [outer].
std::vector<config::Key<PathsConfig>> path_keys();
// At most kMaxPaths paths; `path` one of them; a router only with modules.
void check_paths(const PathsConfig& c, const config::Fail& fail);

}  // namespace loom::dipaco
