#include "loom/data/shard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::data {

namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t dtype;
  uint64_t count;
  uint32_t vocab_size;
  uint32_t pad;
};
static_assert(sizeof(Header) == kShardHeaderBytes);

constexpr const char* kChangedHint =
    "prepare it again with loom data prepare (and leave it unchanged while training)";

// n bytes at `offset`, or an error naming the shard: it is shorter than it was (truncated while
// open), or unreadable.
void pread_exact(int fd, void* dst, size_t n, uint64_t offset, const std::string& path) {
  const size_t got = pread_full(fd, dst, n, offset, "read token shard", path);
  if (got < n)
    throw Error(fmt::format("token shard {}: {} bytes at offset {} are no longer there (the "
                            "file was truncated while open)",
                            path, n - got, offset + got),
                kChangedHint);
}

}  // namespace

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  const ShardDType dt = vocab_size <= 65535 ? ShardDType::u16 : ShardDType::i32;
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.dtype = uint32_t(dt);
  h.count = tokens.size();
  h.vocab_size = uint32_t(vocab_size);
  std::vector<uint16_t> narrow;
  Bytes body{tokens.data(), tokens.size() * 4};
  if (dt == ShardDType::u16) {
    narrow.assign(tokens.begin(), tokens.end());
    body = {narrow.data(), narrow.size() * 2};
  }
  const Bytes parts[] = {{&h, sizeof h}, body};
  write_file_atomic(path, parts);
}

Shard Shard::open(const std::string& path) {
  Shard s;
  s.path_ = path;
  s.fd_ = open_regular(path);
  const int fd = s.fd_.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw Error(fmt::format("token shard {}: cannot stat: {}", path, std::strerror(errno)));
  const uint64_t bytes = uint64_t(st.st_size);
  s.bytes_ = int64_t(st.st_size);
  s.mtime_s_ = int64_t(st.st_mtim.tv_sec);
  s.mtime_ns_ = int64_t(st.st_mtim.tv_nsec);
  const std::string hint = "prepare it again with loom data prepare";
  if (bytes < sizeof(Header))
    throw Error(fmt::format("token shard {}: {} bytes is shorter than the {}-byte header "
                            "(truncated?)",
                            path, bytes, sizeof(Header)),
                hint);
  Header h;
  pread_exact(fd, &h, sizeof h, 0, path);
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    throw Error(fmt::format("token shard {}: not a token shard (no LOOMTOK1 magic)", path), hint);
  if (h.version != kVersion)
    throw Error(fmt::format("token shard {}: version {} (this loom reads version {})", path,
                            h.version, kVersion),
                hint);
  int64_t width = 0;
  if (h.dtype == uint32_t(ShardDType::u16))
    width = 2;
  else if (h.dtype == uint32_t(ShardDType::i32))
    width = 4;
  else
    throw Error(fmt::format("token shard {}: unknown dtype code {}", path, h.dtype), hint);
  // count * width could overflow for a corrupt count; compare in the token domain first
  if (h.count > (UINT64_MAX - sizeof(Header)) / uint64_t(width))
    throw Error(
        fmt::format("token shard {}: the header's token count {} is impossible", path, h.count),
        hint);
  const uint64_t expect = sizeof(Header) + h.count * uint64_t(width);
  if (bytes != expect)
    throw Error(fmt::format("token shard {}: expected {} bytes (a 32-byte header and {} tokens of "
                            "{} bytes) but the file has {} ({})",
                            path, expect, h.count, width, bytes,
                            bytes < expect ? "truncated" : "trailing bytes"),
                hint);
  // token ids are i32, and a model's vocabulary at most 2^31-1 (models::ModelLimits)
  if (h.vocab_size < 1 || h.vocab_size > uint32_t(INT32_MAX))
    throw Error(fmt::format("token shard {}: the header's vocab_size {} is not in [1, 2^31-1]",
                            path, h.vocab_size),
                hint);
  s.dtype_ = ShardDType(h.dtype);
  s.count_ = int64_t(h.count);
  s.vocab_ = int64_t(h.vocab_size);
  // every token checked once here (read() checks again what it reads)
  std::vector<int32_t> chunk;
  for (int64_t i = 0; i < s.count_; i += int64_t(chunk.size())) {
    chunk.resize(size_t(std::min<int64_t>(s.count_ - i, int64_t(1) << 20)));
    s.read(i, int64_t(chunk.size()), chunk.data());
  }
  return s;
}

void Shard::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0)
    throw Error(fmt::format("token shard {}: cannot stat: {}", path_, std::strerror(errno)));
  if (int64_t(st.st_size) != bytes_)
    throw Error(fmt::format("token shard {}: {} bytes, {} when it was opened (the file was "
                            "truncated or extended while open)",
                            path_, int64_t(st.st_size), bytes_),
                kChangedHint);
  if (int64_t(st.st_mtim.tv_sec) != mtime_s_ || int64_t(st.st_mtim.tv_nsec) != mtime_ns_)
    throw Error(fmt::format("token shard {}: written to since it was opened (its modification "
                            "time moved)",
                            path_),
                kChangedHint);
}

void Shard::read(int64_t start, int64_t n, int32_t* out) const {
  LOOM_CHECK(fd_.get() >= 0 && start >= 0 && n >= 0 && start + n <= count_)
      << "token shard " << path_ << ": tokens [" << start << ", " << start + n << ") of " << count_;
  check_unchanged();
  const int64_t width = dtype_ == ShardDType::u16 ? 2 : 4;
  const uint64_t offset = sizeof(Header) + uint64_t(start) * uint64_t(width);
  if (dtype_ == ShardDType::i32) {
    pread_exact(fd_.get(), out, size_t(n) * 4, offset, path_);
  } else {
    std::vector<uint16_t> narrow(static_cast<size_t>(n));
    pread_exact(fd_.get(), narrow.data(), size_t(n) * 2, offset, path_);
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t(narrow[size_t(i)]);
  }
  for (int64_t i = 0; i < n; ++i)
    if (out[i] < 0 || out[i] >= vocab_)
      throw Error(
          fmt::format("token shard {}: token {} at index {} is outside the vocabulary of {}", path_,
                      out[i], start + i, vocab_),
          kChangedHint);
}

}  // namespace loom::data
