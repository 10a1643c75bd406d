// Token shards: the on-disk form of a tokenized corpus that `loom data prepare` writes and
// `loom train` reads.
//
// Layout (little-endian), 32-byte header then the tokens:
//   offset 0   8 bytes  magic "LOOMTOK1"
//   offset 8   u32      version (1)
//   offset 12  u32      dtype code: 1 = u16, 2 = i32 (u16 whenever vocab_size <= 65535)
//   offset 16  u64      count (tokens)
//   offset 24  u32      vocab_size (every token is < this)
//   offset 28  u32      zero padding
//   offset 32  count tokens of the dtype's width
// Worked example: 3 tokens {7, 1, 300} with vocab 512 make a 32 + 3*2 = 38-byte file.
//
// Invariant: a shard on disk is complete or absent (written to a temporary, fsynced, renamed); a
// reader accepts only a file whose size equals 32 + count * width and whose tokens are <
// vocab_size. The reader keeps the file open and reads what it is asked for with pread (not a
// memory mapping: a file truncated under a mapping kills the process with SIGBUS, and one
// rewritten in place changes tokens already checked); every read is checked again, so a shard
// that changes on disk while training is an error naming it, never a crash or a token outside
// the vocabulary; and the file's size and modification time are compared at every read with what
// they were when it was opened, so one rewritten in place with tokens the vocabulary holds is an
// error too (an fstat a read). Not here: compression, or shards split across files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/file.h"

namespace loom::data {

enum class ShardDType : uint32_t { u16 = 1, i32 = 2 };

inline constexpr int64_t kShardHeaderBytes = 32;

// Writes `tokens` to `path` atomically. Throws loom::Error naming the path on an I/O failure.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size);

// One open shard (movable, not copyable).
class Shard {
 public:
  // Throws loom::Error naming the path: missing, not a shard (magic), unknown version or dtype, a
  // size that does not match the header's count (truncated: expected vs actual bytes), or a token
  // >= vocab_size.
  static Shard open(const std::string& path);

  Shard() = default;
  Shard(Shard&&) noexcept = default;
  Shard& operator=(Shard&&) noexcept = default;

  int64_t size() const { return count_; }
  int64_t vocab_size() const { return vocab_; }
  ShardDType dtype() const { return dtype_; }
  // Tokens [start, start + n) into out. Throws loom::Error naming the shard when the file changed
  // since it was opened (its size or modification time), no longer holds them (truncated), or
  // holds a token outside the vocabulary (rewritten).
  void read(int64_t start, int64_t n, int32_t* out) const;
  int32_t operator[](int64_t i) const {
    int32_t t;
    read(i, 1, &t);
    return t;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Fd fd_{-1};
  int64_t count_ = 0, vocab_ = 0;
  ShardDType dtype_ = ShardDType::u16;
  // the file as opened: its size and modification time (seconds, nanoseconds)
  int64_t bytes_ = 0, mtime_s_ = 0, mtime_ns_ = 0;
  void check_unchanged() const;
};

}  // namespace loom::data
