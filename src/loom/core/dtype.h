// Element types of Loom tensors: f32, bf16, i32. bf16 is stored as the top 16 bits of an f32 and
// converted with round-to-nearest-even (NaN stays NaN), matching PyTorch and oneDNN.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace loom {

enum class DType : uint8_t { f32, bf16, i32 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", "i32": the IR text spelling
bool parse_dtype(std::string_view s, DType* out);

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                               // nearest even
  return bf16{uint16_t(u >> 16)};
}

}  // namespace loom
