#include "loom/outer/tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "loom/core/dtype.h"
#include "loom/core/file.h"

namespace loom::outer {

TensorList zeros_like(const TensorList& t) {
  TensorList out;
  out.reserve(t.size());
  for (const auto& x : t)
    out.push_back({x.name, x.shape, std::vector<float>(size_t(numel(x.shape)))});
  return out;
}

int64_t total_elements(const TensorList& t) {
  int64_t n = 0;
  for (const auto& x : t) n += int64_t(x.data.size());
  return n;
}

size_t element_bytes(proto::Encoding e) { return e == proto::BF16 ? 2 : 4; }

bool for_each_chunk(const TensorList& tensors, proto::Encoding enc,
                    const std::function<bool(proto::TensorChunk&)>& emit) {
  const size_t es = element_bytes(enc), per = kChunkBytes / es;
  proto::TensorChunk c;
  std::string buf;
  for (const auto& t : tensors) {
    for (size_t off = 0; off < t.data.size(); off += per) {
      size_t n = std::min(per, t.data.size() - off);
      buf.resize(n * es);
      if (enc == proto::BF16) {
        auto* p = reinterpret_cast<uint16_t*>(buf.data());
        for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(t.data[off + i]).bits;
      } else {
        std::memcpy(buf.data(), t.data.data() + off, n * 4);
      }
      c.set_name(t.name);
      c.set_offset(off);
      c.set_encoding(enc);
      c.set_data(buf);
      if (!emit(c)) return false;
    }
  }
  return true;
}

Assembler::Assembler(const TensorList& expected) : out_(zeros_like(expected)) {}

std::string Assembler::add(const proto::TensorChunk& c) {
  // a finished tensor hands over to the next one
  size_t pos = pos_;
  int64_t off = off_;
  while (pos < out_.size() && off == int64_t(out_[pos].data.size())) ++pos, off = 0;
  if (pos == out_.size())
    return fmt::format("chunk of tensor '{}' after every tensor was complete", c.name());
  Tensor& t = out_[pos];
  if (c.name() != t.name)
    return fmt::format("expected a chunk of tensor '{}', got '{}'", t.name, c.name());
  if (c.encoding() != proto::F32 && c.encoding() != proto::BF16)
    return fmt::format("tensor '{}': unknown encoding {}", t.name, int(c.encoding()));
  const size_t es = element_bytes(c.encoding());
  const std::string& d = c.data();
  if (d.empty() || d.size() % es != 0)
    return fmt::format("tensor '{}': a chunk of {} bytes is not a whole number of {}-byte elements",
                       t.name, d.size(), es);
  if (c.offset() != uint64_t(off))
    return fmt::format("tensor '{}': chunk at element {}, expected {}", t.name, c.offset(), off);
  const int64_t n = int64_t(d.size() / es), size = int64_t(t.data.size());
  if (n > size - off)
    return fmt::format("tensor '{}' {}: a chunk of {} elements at {} overruns its {} elements",
                       t.name, shape_str(t.shape), n, off, size);
  float* dst = t.data.data() + off;
  if (es == 2) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, d.data() + 2 * i, 2);
      dst[i] = bf16_to_f32(bf16{b});
    }
  } else {
    std::memcpy(dst, d.data(), size_t(n) * 4);
  }
  if (const int64_t i = first_nonfinite(dst, n); i >= 0) {
    std::fill(dst, dst + n, 0.f);
    return fmt::format("tensor '{}': non-finite value at element {}", t.name, off + i);
  }
  pos_ = pos;
  off_ = off + n;
  bytes_ += d.size();
  return "";
}

std::string Assembler::finish() const {
  size_t pos = pos_;
  int64_t off = off_;
  while (pos < out_.size() && off == int64_t(out_[pos].data.size())) ++pos, off = 0;
  if (pos == out_.size()) return "";
  return fmt::format("tensor '{}' {} incomplete: {} of {} elements received", out_[pos].name,
                     shape_str(out_[pos].shape), off, out_[pos].data.size());
}

}  // namespace loom::outer
