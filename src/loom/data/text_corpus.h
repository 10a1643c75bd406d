// A training corpus, sampled deterministically. Two sources:
//   - text: a file, or a directory of .txt files, read as bytes (token = byte, so a model needs
//     vocab_size >= 256), split into train and validation by holding out whole files;
//   - prepared: a directory written by `loom data prepare` (meta.json, train.bin, val.bin), whose
//     token shards are read as each batch needs them (shard.h); the tokenizer's vocabulary is
//     meta.json's vocab_size.
//
// Sampling is a pure function of (seed, step, rank, row), the same for both sources: row r of the
// batch for `step` starts at offset splitmix64(seed, step, rank, r) mod (size - T - 1). A resumed
// run therefore sees exactly the batches it would have seen, with no loader state to save.
//
// Not here: tokenizing (tokenizer/tokenizer.h; `loom data prepare` does it ahead of training).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/shard.h"

namespace loom::data {

// A text input split into training and validation text: every `val_every`-th file (by sorted name)
// when there are >= 2 files, else the last 10% of a single file. `loom data prepare` and
// TextCorpus::open split the same way.
struct TextSplit {
  std::string train, val;
  std::vector<std::string> train_files, val_files;
};
// Throws loom::Error naming the path if it is missing, unreadable or holds no .txt file.
TextSplit split_text(const std::string& path, int val_every = 10);

class TextCorpus {
 public:
  // True if `path` is a directory holding meta.json, train.bin and val.bin.
  static bool is_prepared(const std::string& path);
  // Throws loom::Error naming the path (or file) if it is missing, unreadable, malformed, or too
  // small for `seq_len`. `val_every` applies to text only (a prepared directory is already split).
  static TextCorpus open(const std::string& path, int64_t seq_len, int val_every = 10);

  enum class Split { train, val };
  // tokens (B, T+1) for the given step and rank.
  void sample(Split split, uint64_t seed, int64_t step, int rank, int64_t B, int64_t T,
              int32_t* tokens) const;
  int64_t size(Split s) const { return (s == Split::train ? train_ : val_).size(); }
  // tokens [start, start + n) of a split, start + n <= size(s)
  void read(Split s, int64_t start, int64_t n, int32_t* out) const {
    (s == Split::train ? train_ : val_).read(start, n, out);
  }
  const std::vector<std::string>& val_files() const { return val_files_; }
  // prepared: meta.json's path (for messages), "" for text
  const std::string& meta_path() const { return meta_; }
  bool prepared() const { return !meta_.empty(); }
  // Every token is < vocab_size(): 256 for text, meta.json's vocab_size for a prepared directory.
  int64_t vocab_size() const { return vocab_; }

 private:
  // One split's tokens: bytes held in memory, or an open shard.
  struct Tokens {
    std::vector<uint8_t> bytes;
    Shard shard;
    bool sharded = false;
    int64_t size() const { return sharded ? shard.size() : int64_t(bytes.size()); }
    void read(int64_t start, int64_t n, int32_t* out) const {
      if (sharded) return shard.read(start, n, out);
      for (int64_t i = 0; i < n; ++i) out[i] = int32_t(bytes[size_t(start + i)]);
    }
  };
  Tokens train_, val_;
  std::vector<std::string> val_files_;
  std::string meta_;
  int64_t vocab_ = 256;
};

}  // namespace loom::data
