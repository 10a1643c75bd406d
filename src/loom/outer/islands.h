// run_islands: DiLoCo on one machine — the front door of `loom islands`. Starts `loom outer-server`
// and N `loom train` islands as processes talking over loopback, waits for the islands, stops the
// server, and evaluates the final global parameters on the validation split (the number to compare
// with a synchronous run).
//
//   RUN/server/      the server's state (outer_state.safetensors), port and log.txt
//   RUN/island_I/    each island's run directory (metrics.jsonl, checkpoints) and log.txt
//   RUN/summary.json val_loss of the global parameters, version, bytes, wall time, per-island
//                    figures
//
// DiPaCo ([outer] modules and router, dipaco/paths.h): island i trains path i mod P on the router's
// ROUTER/path_<p> data (so the islands must be a multiple of the P paths); at the end each path's
// global parameters are written as RUN/path_<p>/ (model.safetensors, and the config.toml of an
// island of that path: what `loom sample RUN --path` and `loom dipaco eval RUN` read), and val_loss
// is the mean over the paths of each one's loss on its own validation documents.
//
// The shared token is $LOOM_OUTER_TOKEN when set (or [outer] token_file), else a fresh random one
// handed to the children in their environment. Each island gets OMP_NUM_THREADS = cores / N unless
// the variable is set, and OpenMP threads that sleep rather than spin while waiting (these are set
// in this process's environment, which the children inherit).
//
// Not here: the server and the island's side of the loop (server.h, island.h), which the children
// run.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::outer {

struct IslandsOptions {
  std::string config;                   // a config with an [outer] section
  std::string run_dir;                  // empty: runs/<config>-islands
  int islands = 4;                      // 1..256
  std::vector<std::string> sets;        // section.key=value overrides for server and islands
  std::map<int, std::string> slowdown;  // island -> its loom train --slowdown factor
  std::map<int, std::string> stalls;    // island -> its loom train --stall STEP:SECONDS
  std::string loom_binary;              // the executable the server and islands run as
  std::function<void(const std::string&)> progress;  // a line when the islands start; null: none
};

struct IslandsResult {
  std::string run_dir;
  nlohmann::json summary;  // what RUN/summary.json holds
};

// Runs the islands to the end. Throws loom::Error naming the config, the run directory or the
// failing island (with the tail of its log) for anything that stops the run.
IslandsResult run_islands(const IslandsOptions& o);

// `--slow I=F` specs as run_islands' slowdown: 0 <= I < islands, 1 <= F <= 1000; an error naming
// the spec otherwise.
std::map<int, std::string> parse_slowdowns(const std::vector<std::string>& specs, int islands);
// `--stall I=STEP:SECONDS` specs as run_islands' stalls (train::parse_stall's STEP:SECONDS), one
// per island; an error naming the spec otherwise.
std::map<int, std::string> parse_stalls(const std::vector<std::string>& specs, int islands);

}  // namespace loom::outer
