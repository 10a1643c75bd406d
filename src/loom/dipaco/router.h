// DiPaCo's router (Douillard et al. 2024, arXiv 2403.10616, section 2.3): fixed before training, it
// sends each document to one path by the features a base model computes from the document's first
// tokens, clustered by k-means into as many clusters as there are paths. Training data is sharded
// by path once (`loom dipaco route`), and a prompt is routed the same way at inference
// (`loom sample --path auto`).
//
// Documents: a split's tokens cut into consecutive documents of `doc_tokens` (the corpora here are
// books, with no document boundaries of their own; a last piece shorter than the prefix is left
// out).
//
// Features: the base model's next-token distributions over the document's first `prefix` tokens
// (the softmax of its logits at each position), averaged over the positions, then the square root
// of each probability: what the model expects the document to say. The square root makes the
// Euclidean distance k-means uses the Hellinger distance between those distributions, so a few
// frequent tokens do not drown the rest.
//
// k-means: k-means++ seeding then Lloyd's iterations, deterministic for a seed. Balanced (as
// training shards must be: every path trains the same steps), each cluster takes at most
// ceil(n / k) documents: documents are assigned greedily by ascending distance to a centroid with
// room. Routing a new document takes the nearest centroid, with no capacity.
//
// On disk (`write_router`): DIR/router.safetensors, the centroids f32 (paths, dim) and a
// "loom_router" metadata entry (JSON): {"format": 1, "prefix": 32, "doc_tokens": 512,
// "modules": [2, 2], "base": WEIGHTS, "source": DATA, "docs": [...], ...}; DIR/path_<p>/ holds path
// p's documents as a prepared data directory (meta.json, train.bin, val.bin, the tokenizer).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::dipaco {

struct Router {
  int64_t prefix = 32;           // tokens the features read
  int64_t dim = 0;               // features per document (the vocabulary)
  std::vector<float> centroids;  // (paths, dim)
  nlohmann::json meta;           // the rest of router.safetensors' metadata

  int64_t paths() const { return dim ? int64_t(centroids.size()) / dim : 0; }
  // Throws loom::Error naming `dir` unless its features are those of a vocabulary of `vocab`
  // (what features() computes for the model routing with it).
  void check_features(int64_t vocab, const std::string& dir) const;
  // The nearest centroid to `feature` (dim values); ties go to the lower path.
  int64_t route(const float* feature) const;
};

// The starts of `tokens`' documents of `doc_tokens` (the last one, if shorter, only when it holds
// more than `min_tokens`).
std::vector<int64_t> document_starts(int64_t tokens, int64_t doc_tokens, int64_t min_tokens);

// The features of each of `docs` (each at least 2 tokens; at most `prefix` + 1 are read: the
// features of a document's first `prefix` tokens), (docs.size(), vocab) row-major. `model`: the
// base model's config; `base`: its weights.
std::vector<float> features(const models::ModelConfig& model, train::ParamStore& base,
                            const std::vector<std::vector<int32_t>>& docs, int64_t prefix);

struct Clusters {
  std::vector<float> centroids;  // (k, dim)
  std::vector<int64_t> assign;   // each point's cluster
  int iterations = 0;            // Lloyd's iterations run (it stops when no point moves)
};
// k-means of n = x.size() / dim points. Throws loom::Error when k < 1 or k > n.
Clusters kmeans(const std::vector<float>& x, int64_t dim, int64_t k, int max_iters, uint64_t seed,
                bool balanced);

void write_router(const std::string& dir, const Router& r);
// Throws loom::Error naming the file: missing, not a router, an unknown format.
Router read_router(const std::string& dir);

}  // namespace loom::dipaco
