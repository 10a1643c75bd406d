#include "loom/data/shard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
  Fd f = open_regular(path);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0)
    throw Error(fmt::format("token shard {}: cannot stat: {}", path, std::strerror(errno)));
  const uint64_t bytes = uint64_t(st.st_size);
  const std::string hint = "prepare it again with loom data prepare";
  if (bytes < sizeof(Header))
    throw Error(fmt::format("token shard {}: {} bytes is shorter than the {}-byte header "
                            "(truncated?)",
                            path, bytes, sizeof(Header)),
                hint);
  s.map_ = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, f.get(), 0);
  if (s.map_ == MAP_FAILED) {
    s.map_ = nullptr;
    throw Error(fmt::format("token shard {}: cannot mmap: {}", path, std::strerror(errno)));
  }
  s.map_bytes_ = bytes;
  Header h;
  std::memcpy(&h, s.map_, sizeof h);
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
  s.dtype_ = ShardDType(h.dtype);
  s.count_ = int64_t(h.count);
  s.vocab_ = int64_t(h.vocab_size);
  s.tokens_ = static_cast<const char*>(s.map_) + sizeof(Header);
  for (int64_t i = 0; i < s.count_; ++i) {
    const int32_t t = s[i];
    if (t < 0 || t >= s.vocab_)
      throw Error(
          fmt::format("token shard {}: token {} at index {} is outside the vocabulary of {}", path,
                      t, i, s.vocab_),
          hint);
  }
  return s;
}

Shard::Shard(Shard&& o) noexcept { *this = std::move(o); }

Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
    vocab_ = o.vocab_;
    dtype_ = o.dtype_;
  }
  return *this;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace loom::data
