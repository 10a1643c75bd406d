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
// vocab_size. Not here: compression, or shards split across files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

enum class ShardDType : uint32_t { u16 = 1, i32 = 2 };

inline constexpr int64_t kShardHeaderBytes = 32;

// Writes `tokens` to `path` atomically. Throws loom::Error naming the path on an I/O failure.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size);

// A read-only memory mapping of one shard (RAII: unmapped on destruction; movable, not copyable).
class Shard {
 public:
  // Throws loom::Error naming the path: missing, not a shard (magic), unknown version or dtype, a
  // size that does not match the header's count (truncated: expected vs actual bytes), or a token
  // >= vocab_size.
  static Shard open(const std::string& path);

  Shard() = default;
  Shard(Shard&& o) noexcept;
  Shard& operator=(Shard&& o) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  int64_t size() const { return count_; }
  int64_t vocab_size() const { return vocab_; }
  ShardDType dtype() const { return dtype_; }
  const void* data() const { return tokens_; }  // size() tokens of dtype()
  int32_t operator[](int64_t i) const {
    return dtype_ == ShardDType::u16 ? int32_t(static_cast<const uint16_t*>(tokens_)[i])
                                     : static_cast<const int32_t*>(tokens_)[i];
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t count_ = 0, vocab_ = 0;
  ShardDType dtype_ = ShardDType::u16;
};

}  // namespace loom::data
