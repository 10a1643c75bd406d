#include "loom/core/checksum.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>

namespace loom {

uint32_t crc32(const void* data, size_t n) {
  // crc32_z takes a size_t length; chunked anyway, to stay within any zlib's uInt
  uLong c = ::crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const size_t k = std::min<size_t>(n, size_t(1) << 30);
    c = ::crc32(c, p, uInt(k));
    p += k;
    n -= k;
  }
  return uint32_t(c);
}

std::string crc32_hex(const void* data, size_t n) { return fmt::format("{:08x}", crc32(data, n)); }

}  // namespace loom
