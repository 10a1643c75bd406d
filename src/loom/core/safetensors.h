// Reads and writes safetensors files: the checkpoint format of Hugging Face and PyTorch.
//
// Layout: an 8-byte little-endian u64 N, N bytes of JSON, then the data buffer. The JSON maps each
// tensor name to {"dtype": "F32"|"BF16"|"I32", "shape": [..], "data_offsets": [begin, end]}, with
// offsets relative to the start of the data buffer, plus an optional "__metadata__": {str: str}.
//
// The reader is strict, with the same rules as the Hugging Face library
// (safetensors/src/tensor.rs): the tensors must tile the data buffer exactly, back to back with no
// hole, overlap or trailing byte, and each byte count must equal product(shape) * dtype size. On
// top of that it rejects what that library tolerates: duplicate keys, unknown keys in an entry, and
// dtypes Loom has no type for (F16, I64, ... are named as unsupported rather than misread). Every
// problem is a loom::Error naming the file and, where there is one, the tensor.
//
// Checksums (core/checksum.h): write_safetensors records each tensor's CRC-32 in "__metadata__" as
// "loom.crc32.<tensor>"; open verifies every such entry and refuses the file naming the tensor
// whose bytes no longer match (a flipped bit, a torn write). Files of other writers carry none and
// are read as they are.
//
// Not done here: F16/F64/I64/... conversion, lazy or mmap'd loading (the data buffer is read
// whole), sharded checkpoints (model-00001-of-00004.safetensors plus an index.json).
//
// Invariant: every TensorView::data is aligned to at least its dtype's size, so it may be read as
// const float* / const int32_t* directly. The data buffer itself is 64-byte aligned; a tensor sits
// at its file offset within it, which for files written by write_safetensors or by Hugging Face is
// a multiple of the element size. A tensor a foreign writer left misaligned is copied to its own
// 64-byte aligned block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/core/dtype.h"

namespace loom {

// A tensor inside an open SafetensorsFile; `data` lives as long as the file object does.
struct TensorView {
  DType dtype;
  std::vector<int64_t> shape;  // row-major; [] is a scalar
  const void* data;            // nbytes bytes, aligned to dtype_size(dtype)
  size_t nbytes;
};

class SafetensorsFile {
 public:
  // Reads and validates the whole file. Throws loom::Error naming `path` on any problem.
  static SafetensorsFile open(const std::string& path);
  // Reads and validates the header only (names, dtypes, shapes, extents); get() then reads each
  // tensor on first use, checking its CRC-32, and keeps it; read() copies one into caller memory
  // without keeping it. For files read piecewise: a sharded checkpoint's rank files.
  static SafetensorsFile open_lazy(const std::string& path);
  // Copies tensor `name`'s bytes into `dst` (nbytes of it), checked against its recorded CRC-32.
  // Throws naming the file and tensor (no such tensor, a read error, a failed checksum).
  void read(const std::string& name, void* dst) const;

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  bool contains(const std::string& name) const;
  // Throws loom::Error naming the file and the tensor if there is no such tensor.
  const TensorView& get(const std::string& name) const;
  // Tensor names in data-buffer (offset) order.
  const std::vector<std::string>& names() const { return names_; }
  // The "__metadata__" map; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  using AlignedBytes = std::unique_ptr<std::byte[], FreeAligned>;
  static AlignedBytes alloc_aligned(size_t n);

  SafetensorsFile() = default;

  std::string path_;
  AlignedBytes buffer_;  // the data buffer, 64-byte aligned
  // copies of tensors the file left misaligned; a lazy file's tensors as get() reads them
  mutable std::vector<AlignedBytes> realigned_;
  mutable std::unordered_map<std::string, TensorView> tensors_;
  // a lazy file: each tensor's place, read on demand
  struct Extent {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // in the file
  };
  std::unordered_map<std::string, Extent> lazy_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // row-major; [] is a scalar
  const void* data;            // product(shape) * dtype_size(dtype) bytes
};

// Writes `tensors` to `path` atomically: the bytes go to PATH.tmp.<pid>, which is fsynced and
// renamed over PATH, then the directory is fsynced. On any failure the temporary file is removed,
// PATH keeps its old contents (if it had any), and a loom::Error names the path and the OS error
// (ENOSPC, ...).
//
// Layout, as Hugging Face writes it: the header is padded with spaces to a multiple of 8 bytes, and
// the tensors follow back to back, ordered by descending element size (F32/I32 before BF16) and
// otherwise in the given order. That order puts every tensor at a multiple of its element size. No
// "__metadata__" key is written when `metadata` is empty and `checksums` is false; with
// `checksums` (the default) it also holds each tensor's CRC-32 ("loom.crc32.<tensor>").
//
// Concurrent writers of the same PATH within one process are not supported (they share a temp
// name).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       bool checksums = true);

}  // namespace loom
