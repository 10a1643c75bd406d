#include "loom/core/dtype.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  if (s == "f32")
    *out = DType::f32;
  else if (s == "bf16")
    *out = DType::bf16;
  else if (s == "i32")
    *out = DType::i32;
  else
    return false;
  return true;
}

}  // namespace loom
