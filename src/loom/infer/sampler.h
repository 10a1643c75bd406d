// Sampler: the next token from one position's logits — greedy, or a draw from the softmax of the
// top k logits at a temperature, from a seeded generator whose draws are the same on every
// standard library (53 random bits, not std::uniform_real_distribution).
//
// Invariant: next() is a function of (logits, temperature, top_k, seed, calls so far); candidates
// are ordered by logit with ties to the lower id, so even greedy decoding is fully determined.
#pragma once

#include <cstdint>
#include <random>

namespace loom::infer {

class Sampler {
 public:
  // temperature 0: greedy; top_k 0: every candidate.
  Sampler(double temperature, int64_t top_k, uint64_t seed)
      : temperature_(temperature), top_k_(top_k), rng_(seed) {}
  // logits: (n,) for one position, the candidate ids 0..n-1. Returns the chosen id.
  int next(const float* logits, int n);

 private:
  double temperature_;
  int64_t top_k_;
  std::mt19937_64 rng_;
};

}  // namespace loom::infer
