// DiPaCo's routing and its evaluation as library calls — the front doors of `loom dipaco route` and
// `loom dipaco eval`, which parse flags and print.
//
// route(): cuts the config's [data] training split into documents of doc_tokens and holds every
// holdout_every-th out (the in-distribution test documents); computes the others' features with
// the base model, clusters them into the paths of [outer] modules (balanced k-means: router.h) and
// writes the router (OUT/router.safetensors, OUT/base.safetensors), each path's documents as a
// prepared data directory OUT/path_<p> (train.bin: its documents; val.bin: the held-out documents
// the router sends it), and OUT/all (every path's documents; val.bin: every held-out one), what a
// dense model of the same data trains on. `loom islands` with [outer] router = OUT trains the
// paths.
//
// evaluate(): RUN is a DiPaCo `loom islands` run (its path_<p>/ models). Two sets of documents,
// each routed by its first tokens and scored (mean cross-entropy over all its tokens) by every
// path: "heldout" (the held-out training documents: the training distribution) and "val" (the
// validation split: for a directory of books, books no path trained on). Per set: the routed
// paths' loss, the mean path's, the best path's (an oracle), how often the routed path beats the
// mean one, per-path figures, and with a dense model its loss on the same documents.
//
// Invariant: a router directory is whole or absent: the data directories are written first, each
// file atomically, and router.safetensors, which marks the directory as a router, last.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/train/params.h"

namespace loom::dipaco {

// Loads the weights at `path` (a run, a checkpoint, a .safetensors, or, where the caller can read
// one, a loom islands server directory) into `params`; throws loom::Error naming it.
using WeightsLoader = std::function<void(const std::string& path, train::ParamStore& params)>;

struct RouteOptions {
  std::string config;             // the DiPaCo config: [outer] modules, [data], [model]
  std::vector<std::string> sets;  // section.key=value overrides
  std::string base;               // the base model computing the features
  std::string out;                // the router directory to write
  int64_t doc_tokens = 512, prefix = 32, iters = 100, seed = 0, holdout_every = 20;
  WeightsLoader load_weights;
};

struct RouteResult {
  nlohmann::json paths;  // per path: its training documents and tokens, its validation documents
  int64_t train_docs = 0, held_out = 0, val_docs = 0, iterations = 0;
};

// Throws loom::Error naming the config or directory: no modules, a router already there, no data,
// fewer documents than paths, a data vocabulary larger than the model's.
RouteResult route(const RouteOptions& o);

struct EvalOptions {
  std::string run;    // a DiPaCo loom islands run
  std::string dense;  // a dense model to score on the same documents; empty: none
  WeightsLoader load_weights;
};

// {"doc_tokens", "heldout": {...}, "val": {...}} as described above. Throws loom::Error naming the
// run or the router when it is not a DiPaCo run or has no document to score.
nlohmann::json evaluate(const EvalOptions& o);

}  // namespace loom::dipaco
