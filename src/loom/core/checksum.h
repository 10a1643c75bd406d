// Checksums of what Loom writes, so that a reader can tell a damaged file from a whole one.
//
// CRC-32 (zlib's, the IEEE polynomial as in gzip and PNG), written as 8 lower-case hex digits.
// write_safetensors records one per tensor in the file's "__metadata__" ("loom.crc32.<tensor>") and
// SafetensorsFile::open verifies every one it finds; checkpoints record their state's and
// config's (train/checkpoint.cc). It detects accidental damage (a flipped bit, a torn or truncated
// write), not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

uint32_t crc32(const void* data, size_t n);
std::string crc32_hex(const void* data, size_t n);
inline std::string crc32_hex(std::string_view s) { return crc32_hex(s.data(), s.size()); }

}  // namespace loom
