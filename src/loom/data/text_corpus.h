// A byte-level text corpus: a file, or a directory of .txt files, read as bytes (token = byte, so a
// model needs vocab_size >= 256), split into train and validation by holding out whole files, and
// sampled deterministically.
//
// Sampling is a pure function of (seed, step, rank, row): row r of the batch for `step` starts at
// offset splitmix64(seed, step, rank, r) mod (size - T - 1). A resumed run therefore sees exactly the
// batches it would have seen, with no loader state to save.
//
// Not here (issue 4's data layer): SentencePiece tokenizers and on-disk token shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

class TextCorpus {
 public:
  // Throws loom::Error naming the path if it is missing, unreadable or too small for `seq_len`.
  // Validation: every `val_every`-th file (by sorted name) when there are >= 2 files; a single file
  // keeps its last 10% for validation.
  static TextCorpus open(const std::string& path, int64_t seq_len, int val_every = 10);

  enum class Split { train, val };
  // tokens (B, T+1) for the given step and rank.
  void sample(Split split, uint64_t seed, int64_t step, int rank, int64_t B, int64_t T,
              int32_t* tokens) const;
  int64_t size(Split s) const { return int64_t(s == Split::train ? train_.size() : val_.size()); }
  const std::vector<std::string>& val_files() const { return val_files_; }

 private:
  std::vector<uint8_t> train_, val_;
  std::vector<std::string> val_files_;
};

}  // namespace loom::data
