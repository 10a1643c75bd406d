#include "loom/outer/tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::outer {

namespace {

int qmax(proto::Encoding e) { return e == proto::INT8 ? 127 : 7; }
int64_t blocks(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

// x[0, n) as scales then values (outer.proto's INT8 / INT4 layout) into out.
void quantize(proto::Encoding e, const float* x, int64_t n, std::string& out) {
  out.assign(quantized_bytes(e, n), '\0');
  auto* scales = reinterpret_cast<char*>(out.data());
  auto* q = reinterpret_cast<uint8_t*>(out.data()) + 4 * blocks(n);
  const float top = float(qmax(e));
  for (int64_t b = 0; b < blocks(n); ++b) {
    const int64_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
    float amax = 0;
    for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / top, inv = amax > 0 ? top / amax : 0.f;
    std::memcpy(scales + 4 * b, &scale, 4);
    for (int64_t i = lo; i < hi; ++i) {
      const int v = int(std::clamp(std::nearbyint(x[i] * inv), -top, top));
      if (e == proto::INT8)
        q[i] = uint8_t(int8_t(v));
      else
        q[i / 2] |= uint8_t((v & 0xF) << (4 * (i % 2)));
    }
  }
}

}  // namespace

proto::Encoding encoding_of(const std::string& compress) {
  if (compress == "bf16") return proto::BF16;
  if (compress == "int8") return proto::INT8;
  if (compress == "int4") return proto::INT4;
  return proto::F32;
}

bool quantized(proto::Encoding e) { return e == proto::INT8 || e == proto::INT4; }

size_t quantized_bytes(proto::Encoding e, int64_t n) {
  return size_t(4 * blocks(n) + (e == proto::INT8 ? n : (n + 1) / 2));
}

int64_t chunk_elements(proto::Encoding enc) {
  switch (enc) {
    case proto::BF16:
      return int64_t(kChunkBytes / 2);
    case proto::INT8:  // a block: 64 values and a scale
      return int64_t(kChunkBytes / (kQuantBlock + 4)) * kQuantBlock;
    case proto::INT4:
      return int64_t(kChunkBytes / (kQuantBlock / 2 + 4)) * kQuantBlock;
    default:
      return int64_t(kChunkBytes / 4);
  }
}

bool for_each_chunk(const TensorList& tensors, proto::Encoding enc,
                    const std::function<bool(proto::TensorChunk&)>& emit) {
  const size_t per = size_t(chunk_elements(enc));
  proto::TensorChunk c;
  std::string buf;
  for (const auto& t : tensors) {
    for (size_t off = 0; off < t.data.size(); off += per) {
      size_t n = std::min(per, t.data.size() - off);
      if (quantized(enc)) {
        quantize(enc, t.data.data() + off, int64_t(n), buf);
        c.set_count(uint32_t(n));
      } else if (enc == proto::BF16) {
        buf.resize(n * 2);
        auto* p = reinterpret_cast<uint16_t*>(buf.data());
        for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(t.data[off + i]).bits;
      } else {
        buf.resize(n * 4);
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

Encoded encode(const TensorList& tensors, proto::Encoding enc) {
  Encoded e;
  Assembler as(tensors);
  for_each_chunk(tensors, enc, [&](proto::TensorChunk& c) {
    const std::string err = as.add(c);
    LOOM_CHECK(err.empty()) << "a chunk this process encoded does not decode: " << err;
    e.chunks.push_back(c);
    return true;
  });
  LOOM_CHECK(as.finish().empty()) << as.finish();
  e.decoded = std::move(as.tensors());
  return e;
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
  const proto::Encoding enc = c.encoding();
  if (enc != proto::F32 && enc != proto::BF16 && !quantized(enc))
    return fmt::format("tensor '{}': unknown encoding {}", t.name, int(enc));
  const std::string& d = c.data();
  int64_t n = 0;
  if (quantized(enc)) {
    n = int64_t(c.count());
    if (n == 0 || d.size() != quantized_bytes(enc, n))
      return fmt::format("tensor '{}': a {} chunk of {} elements takes {} bytes, not {}", t.name,
                         enc == proto::INT8 ? "int8" : "int4", n, quantized_bytes(enc, n),
                         d.size());
  } else {
    const size_t es = enc == proto::BF16 ? 2 : 4;
    if (d.empty() || d.size() % es != 0)
      return fmt::format(
          "tensor '{}': a chunk of {} bytes is not a whole number of {}-byte elements", t.name,
          d.size(), es);
    n = int64_t(d.size() / es);
  }
  if (c.offset() != uint64_t(off))
    return fmt::format("tensor '{}': chunk at element {}, expected {}", t.name, c.offset(), off);
  const int64_t size = int64_t(t.data.size());
  if (n > size - off)
    return fmt::format("tensor '{}' {}: a chunk of {} elements at {} overruns its {} elements",
                       t.name, shape_str(t.shape), n, off, size);
  float* dst = t.data.data() + off;
  if (quantized(enc)) {
    const char* scales = d.data();
    const auto* q = reinterpret_cast<const uint8_t*>(d.data()) + 4 * blocks(n);
    for (int64_t b = 0; b < blocks(n); ++b) {
      float scale;
      std::memcpy(&scale, scales + 4 * b, 4);
      if (!(scale >= 0) || !std::isfinite(scale)) {
        std::fill(dst, dst + n, 0.f);
        return fmt::format("tensor '{}': block {} of the chunk at {} has scale {}", t.name, b, off,
                           scale);
      }
      for (int64_t i = b * kQuantBlock; i < std::min(n, (b + 1) * kQuantBlock); ++i) {
        const int v = enc == proto::INT8
                          ? int(int8_t(q[i]))
                          : int(int8_t(uint8_t(q[i / 2] >> (4 * (i % 2))) << 4) >> 4);
        dst[i] = float(v) * scale;
      }
    }
  } else if (enc == proto::BF16) {
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
