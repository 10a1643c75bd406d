// Named f32 tensors as the outer sync service moves them: split into chunks for a gRPC stream, and
// put back together by an Assembler that checks every chunk against the expected tensors.
//
// A stream carries the tensors in the order of the expected list, each as contiguous chunks of at
// most kChunkBytes of data, offsets in elements. The Assembler is the only decoder of tensor data
// that comes off the network: whatever bytes arrive, it either fills the tensors exactly or returns
// a message naming the tensor and what was wrong (unknown or out-of-order name, offset, length,
// encoding, a non-finite value), and never reads or writes outside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/shape.h"
#include "loom/outer/outer.pb.h"
#include "loom/train/tensor_list.h"

namespace loom::outer {

// The tensors it moves: a model's, named, on the host (train/tensor_list.h).
using train::Tensor;
using train::TensorList;
using train::total_elements;
using train::zeros_like;

constexpr size_t kChunkBytes = size_t(1) << 20;

// [outer] compress ("f32", "bf16", "int8", "int4") as the encoding on the wire.
proto::Encoding encoding_of(const std::string& compress);
// Quantised encodings (INT8, INT4): whether `e` is one, elements per scale, and a chunk's bytes
// for n elements.
bool quantized(proto::Encoding e);
constexpr int64_t kQuantBlock = 64;
size_t quantized_bytes(proto::Encoding e, int64_t n);
// Elements of `enc` that fit a chunk of at most kChunkBytes (a multiple of kQuantBlock when
// quantised).
int64_t chunk_elements(proto::Encoding enc);

// Calls emit for each chunk of `tensors` in `enc` (bf16 rounds to nearest even; int8 and int4 round
// each block of 64 to its absmax scale, nearest); stops and returns false when emit does (a broken
// stream).
bool for_each_chunk(const TensorList& tensors, proto::Encoding enc,
                    const std::function<bool(proto::TensorChunk&)>& emit);

// `tensors` encoded as a stream carries them (its chunks), and what those chunks decode to: a
// quantised update is committed as `decoded`, so that whoever decodes `chunks` gets it bit for bit.
struct Encoded {
  std::vector<proto::TensorChunk> chunks;
  TensorList decoded;
};
Encoded encode(const TensorList& tensors, proto::Encoding enc);

class Assembler {
 public:
  // Receives into zero-filled tensors with the names and shapes of `expected` (its data unused).
  explicit Assembler(const TensorList& expected);
  // "" when the chunk fits; otherwise what was wrong, naming the tensor. After an error the
  // Assembler is left as it was before the chunk, so a caller may report and stop.
  std::string add(const proto::TensorChunk& chunk);
  // "" when every tensor arrived in full; otherwise names the first incomplete one.
  std::string finish() const;
  TensorList& tensors() { return out_; }
  size_t bytes_received() const { return bytes_; }

 private:
  TensorList out_;
  size_t pos_ = 0;   // the tensor being received
  int64_t off_ = 0;  // elements of it received
  size_t bytes_ = 0;
};

}  // namespace loom::outer
