// safetensors reader and writer; see safetensors.h for the format, the checks and the invariant.
#include "loom/core/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <system_error>
#include <tuple>

#include "loom/core/checksum.h"
#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom {
namespace {

using nlohmann::json;

constexpr size_t kBufferAlign = 64;
// Hugging Face refuses headers past 100 MB; a larger length is a corrupt or foreign file, and this
// bound keeps a flipped length field from turning into a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kCrcPrefix = "loom.crc32.";  // + tensor name: its CRC-32 (hex)
// Dtypes that safetensors defines but Loom has no element type for: named as unsupported, not
// unknown.
constexpr std::string_view kOtherDtypes[] = {
    "BOOL", "U8",      "I8",      "I16",     "U16",     "F16",     "U32", "I64", "U64",
    "F64",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

// Reads exactly n bytes at offset, or throws (a file that shrinks under us is an error too).
void pread_all(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  if (pread_full(fd, data, n, offset, "read safetensors file", path) < n)
    throw Error(fmt::format("safetensors file '{}': file ended early while reading it", path),
                "another process may be rewriting it; retry once it is done");
}

// ---- header parsing ----------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& path, const std::string& what,
                       const std::string& hint = "") {
  throw Error(fmt::format("safetensors file '{}': {}", path, what), hint);
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name,
                              const std::string& what, const std::string& hint = "") {
  throw Error(fmt::format("safetensors file '{}': tensor '{}': {}", path, name, what), hint);
}

std::string_view st_dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
  }
  LOOM_CHECK(false) << "bad DType " << int(t);
  return "";
}

DType parse_st_dtype(const std::string& path, const std::string& name, const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "BF16") return DType::bf16;
  if (s == "I32") return DType::i32;
  const char* kReads = "Loom reads F32, BF16 and I32";
  if (std::find(std::begin(kOtherDtypes), std::end(kOtherDtypes), s) != std::end(kOtherDtypes)) {
    fail_tensor(path, name, fmt::format("dtype {} is not supported ({})", s, kReads),
                "convert the checkpoint first, e.g. in PyTorch: "
                "{k: v.float() for k, v in load_file(p).items()}");
  }
  fail_tensor(path, name, fmt::format("unknown dtype \"{}\" ({})", s, kReads));
}

const char* json_type(const json& j) {
  if (j.is_number_unsigned()) return "non-negative integer";
  if (j.is_number_integer()) return "negative integer";
  if (j.is_number_float()) return "float";
  return j.type_name();
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// Parses one tensor entry: {"dtype": str, "shape": [uint...], "data_offsets": [uint, uint]}.
Entry parse_entry(const std::string& path, const std::string& name, const json& j) {
  const char* kHint =
      "each tensor needs {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}";
  if (!j.is_object()) {
    fail_tensor(path, name, fmt::format("entry is a {}, not an object", json_type(j)), kHint);
  }
  for (const auto& [key, _] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail_tensor(path, name, fmt::format("unknown key \"{}\"", key), kHint);
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(key)) fail_tensor(path, name, fmt::format("missing \"{}\"", key), kHint);
  }
  Entry e;
  e.name = name;

  const json& dt = j["dtype"];
  if (!dt.is_string()) {
    fail_tensor(path, name, fmt::format("\"dtype\" is a {}, not a string", json_type(dt)), kHint);
  }
  e.dtype = parse_st_dtype(path, name, dt.get<std::string>());

  const json& sh = j["shape"];
  if (!sh.is_array()) {
    fail_tensor(path, name, fmt::format("\"shape\" is a {}, not an array", json_type(sh)), kHint);
  }
  for (const json& d : sh) {
    if (d.is_number_integer() && !d.is_number_unsigned()) {
      fail_tensor(path, name, fmt::format("negative dimension {} in \"shape\"", d.dump()));
    }
    if (!d.is_number_unsigned()) {
      fail_tensor(path, name, fmt::format("\"shape\" holds a {}, not an integer", json_type(d)),
                  kHint);
    }
    uint64_t v = d.get<uint64_t>();
    if (v > uint64_t(INT64_MAX)) {
      fail_tensor(path, name, fmt::format("dimension {} is too large", v));
    }
    e.shape.push_back(int64_t(v));
  }

  const json& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    fail_tensor(path, name,
                fmt::format("\"data_offsets\" is {}, not [begin, end] with non-negative integers",
                            off.dump()),
                kHint);
  }
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  return e;
}

// Checks one entry's offsets against its shape and against the data buffer's size.
void check_extent(const std::string& path, const Entry& e, uint64_t buffer_bytes) {
  if (e.end < e.begin) {
    fail_tensor(path, e.name,
                fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
  }
  // Overflow-checked product(shape) * dtype_size: a corrupt header must not wrap around to a match.
  uint64_t need = dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(need, uint64_t(d), &need)) {
      fail_tensor(path, e.name,
                  fmt::format("shape {} overflows a 64-bit byte count", shape_str(e.shape)));
    }
  }
  if (e.end - e.begin != need) {
    fail_tensor(path, e.name,
                fmt::format("data_offsets [{}, {}] span {} bytes but shape {} of {} needs {} bytes",
                            e.begin, e.end, e.end - e.begin, shape_str(e.shape),
                            st_dtype_name(e.dtype), need));
  }
  if (e.end > buffer_bytes) {
    fail_tensor(path, e.name,
                fmt::format("data_offsets [{}, {}] run past the end of the data buffer ({} bytes)",
                            e.begin, e.end, buffer_bytes),
                "the file is truncated: was it copied partially, or read while being written?");
  }
}

void parse_metadata(const std::string& path, const json& j,
                    std::map<std::string, std::string>* out) {
  const char* kHint = "\"__metadata__\" must be an object mapping strings to strings";
  if (!j.is_object()) fail(path, fmt::format("\"__metadata__\" is a {}", json_type(j)), kHint);
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) {
      fail(path, fmt::format("\"__metadata__\" key \"{}\" holds a {}", key, json_type(value)),
           kHint);
    }
    (*out)[key] = value.get<std::string>();
  }
}

// Parses the header text, rejecting duplicate keys at any depth (nlohmann keeps the last silently,
// which would hide a second definition of a tensor).
json parse_header_json(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> seen;  // keys of each open object, innermost last
  std::string duplicate;
  auto on_event = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      seen.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      seen.pop_back();
    } else if (ev == json::parse_event_t::key && !seen.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, on_event);
  } catch (const json::exception& ex) {
    fail(path, fmt::format("header is not valid JSON: {}", ex.what()),
         "the file is corrupt or not a safetensors file");
  }
  if (!duplicate.empty()) fail(path, fmt::format("header has the key \"{}\" twice", duplicate));
  if (!j.is_object()) {
    fail(path, fmt::format("header is a JSON {}, not an object", json_type(j)),
         "the file is corrupt or not a safetensors file");
  }
  return j;
}

}  // namespace

// ---- reader ------------------------------------------------------------------------------------

void SafetensorsFile::FreeAligned::operator()(std::byte* p) const {
  ::operator delete[](p, std::align_val_t{kBufferAlign});
}

SafetensorsFile::AlignedBytes SafetensorsFile::alloc_aligned(size_t n) {
  return AlignedBytes(static_cast<std::byte*>(::operator new[](n, std::align_val_t{kBufferAlign})));
}

namespace {

// A file's header, validated: its entries sorted by offset (tiling the data buffer exactly), its
// metadata, and where the data buffer starts.
struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0, buffer_bytes = 0;
};

Header read_header(const std::string& path, Fd& fd) {
  struct stat st;
  check_sys(::fstat(fd.get(), &st), "stat safetensors file", path);
  const uint64_t file_bytes = uint64_t(st.st_size);
  const char* kNotSt = "the file is truncated or not a safetensors file";
  if (file_bytes < 8) {
    fail(path, fmt::format("file is {} bytes, shorter than the 8-byte header length", file_bytes),
         kNotSt);
  }

  unsigned char len_bytes[8];
  pread_all(fd.get(), len_bytes, 8, 0, path);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_bytes[i];  // little-endian
  if (header_bytes > file_bytes - 8) {
    fail(path,
         fmt::format("header length {} is larger than the {} bytes that follow it", header_bytes,
                     file_bytes - 8),
         kNotSt);
  }
  if (header_bytes > kMaxHeaderBytes) {
    fail(path,
         fmt::format("header length {} exceeds the {} byte limit", header_bytes, kMaxHeaderBytes),
         kNotSt);
  }
  std::string text(header_bytes, '\0');
  pread_all(fd.get(), text.data(), text.size(), 8, path);
  json header = parse_header_json(path, text);

  Header h;
  std::vector<Entry>& entries = h.entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      parse_metadata(path, value, &h.metadata);
    } else {
      entries.push_back(parse_entry(path, key, value));
    }
  }

  const uint64_t buffer_bytes = file_bytes - 8 - header_bytes;
  for (const Entry& e : entries) check_extent(path, e, buffer_bytes);

  // Tensors must tile [0, buffer_bytes) in offset order. Example: sizes 24 and 8 are valid only as
  // [0,24),[24,32) with 32 data bytes. Empty tensors sort before a non-empty one at the same
  // offset.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;  // invariant: entries before i tile [0, covered)
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < covered) {
      const Entry& prev = entries[i - 1];
      fail_tensor(path, e.name,
                  fmt::format("data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", e.begin,
                              e.end, prev.name, prev.begin, prev.end));
    }
    if (e.begin > covered) {
      fail_tensor(path, e.name,
                  fmt::format("data_offsets [{}, {}] leave a hole of {} bytes before it", e.begin,
                              e.end, e.begin - covered),
                  "safetensors requires tensors to cover the data buffer with no gaps");
    }
    covered = e.end;
  }
  if (covered != buffer_bytes) {
    fail(path,
         fmt::format("{} bytes after the last tensor's data are not part of any tensor",
                     buffer_bytes - covered),
         "safetensors requires the tensors to cover the data buffer exactly");
  }
  h.data_start = 8 + header_bytes;
  h.buffer_bytes = buffer_bytes;
  return h;
}

// A tensor's bytes against the CRC-32 the file records for it (none recorded: nothing to check).
void check_crc(const std::string& path, const std::map<std::string, std::string>& metadata,
               const std::string& name, const void* data, size_t nbytes) {
  auto it = metadata.find(std::string(kCrcPrefix) + name);
  if (it == metadata.end()) return;
  const std::string got = crc32_hex(data, nbytes);
  if (got != it->second)
    fail_tensor(path, name,
                fmt::format("its data fails the checksum the file records (CRC-32 {}, "
                            "recorded {}): the file is damaged",
                            got, it->second),
                "restore the file, or resume from an earlier checkpoint");
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  Fd fd = open_regular(path);
  Header h = read_header(path, fd);
  std::vector<Entry>& entries = h.entries;
  SafetensorsFile f;
  f.path_ = path;
  f.metadata_ = std::move(h.metadata);
  f.buffer_ = alloc_aligned(h.buffer_bytes);
  pread_all(fd.get(), f.buffer_.get(), h.buffer_bytes, h.data_start, path);
  fd.close(path);

  f.names_.reserve(entries.size());
  for (Entry& e : entries) {
    const size_t nbytes = e.end - e.begin;
    const std::byte* data = f.buffer_.get() + e.begin;
    if (e.begin % dtype_size(e.dtype) != 0) {  // keep the alignment invariant: copy
      f.realigned_.push_back(alloc_aligned(nbytes));
      std::memcpy(f.realigned_.back().get(), data, nbytes);
      data = f.realigned_.back().get();
    }
    check_crc(path, f.metadata_, e.name, data, nbytes);
    f.names_.push_back(e.name);
    f.tensors_.emplace(e.name, TensorView{e.dtype, std::move(e.shape), data, nbytes});
  }
  return f;
}

SafetensorsFile SafetensorsFile::open_lazy(const std::string& path) {
  Fd fd = open_regular(path);
  Header h = read_header(path, fd);
  fd.close(path);
  SafetensorsFile f;
  f.path_ = path;
  f.metadata_ = std::move(h.metadata);
  for (Entry& e : h.entries) {
    f.names_.push_back(e.name);
    f.lazy_.emplace(
        e.name, Extent{e.dtype, std::move(e.shape), h.data_start + e.begin, h.data_start + e.end});
  }
  return f;
}

void SafetensorsFile::read(const std::string& name, void* dst) const {
  if (auto t = tensors_.find(name); t != tensors_.end()) {
    std::memcpy(dst, t->second.data, t->second.nbytes);
    return;
  }
  auto it = lazy_.find(name);
  if (it == lazy_.end()) {
    get(name);  // throws, naming the missing tensor and the file's
    return;
  }
  const Extent& e = it->second;
  const size_t nbytes = size_t(e.end - e.begin);
  Fd fd = open_regular(path_);
  pread_all(fd.get(), dst, nbytes, e.begin, path_);
  fd.close(path_);
  check_crc(path_, metadata_, name, dst, nbytes);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return tensors_.count(name) != 0 || lazy_.count(name) != 0;
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  if (auto l = lazy_.find(name); l != lazy_.end()) {  // a lazy file's tensor, read now and kept
    const size_t nbytes = size_t(l->second.end - l->second.begin);
    realigned_.push_back(alloc_aligned(std::max<size_t>(nbytes, 1)));
    read(name, realigned_.back().get());
    return tensors_
        .emplace(name,
                 TensorView{l->second.dtype, l->second.shape, realigned_.back().get(), nbytes})
        .first->second;
  }
  constexpr size_t kShown = 5;
  std::vector<std::string> shown;
  for (size_t i = 0; i < names_.size() && i < kShown; ++i) shown.push_back("'" + names_[i] + "'");
  std::string hint =
      names_.empty() ? "the file holds no tensors"
                     : fmt::format("tensors in the file ({}): {}{}", names_.size(),
                                   fmt::join(shown, ", "), names_.size() > kShown ? ", ..." : "");
  fail_tensor(path_, name, "no such tensor in the file", hint);
}

// ---- writer ------------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata, bool checksums) {
  // Largest elements first, stable: every tensor then starts at a multiple of its element size.
  std::vector<const TensorToWrite*> order;
  for (const TensorToWrite& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  // the caller's metadata and each tensor's checksum (verified by open)
  std::map<std::string, std::string> meta = metadata;
  if (checksums)
    for (const TensorToWrite& t : tensors) {
      size_t nbytes = dtype_size(t.dtype);
      for (int64_t d : t.shape) nbytes *= size_t(std::max<int64_t>(d, 0));
      if (t.data) meta[std::string(kCrcPrefix) + t.name] = crc32_hex(t.data, nbytes);
    }
  if (!meta.empty()) header[std::string(kMetadataKey)] = meta;
  std::vector<size_t> sizes;
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    if (t->name == kMetadataKey) {
      throw Error(fmt::format(
          "cannot write safetensors file '{}': \"__metadata__\" is reserved, not a tensor name",
          path));
    }
    if (header.contains(t->name)) {
      throw Error(fmt::format("cannot write safetensors file '{}': tensor name '{}' appears twice",
                              path, t->name));
    }
    size_t nbytes = dtype_size(t->dtype);
    for (int64_t d : t->shape) {
      LOOM_CHECK(d >= 0) << "tensor '" << t->name << "' has negative dim " << d;
      nbytes *= size_t(d);
    }
    LOOM_CHECK(t->data != nullptr || nbytes == 0) << "tensor '" << t->name << "' has no data";
    auto& entry = header[t->name];
    entry["dtype"] = std::string(st_dtype_name(t->dtype));
    entry["shape"] = t->shape;
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + nbytes});
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {  // invalid UTF-8 in a name or metadata string
    throw Error(fmt::format("cannot write safetensors file '{}': {}", path, ex.what()),
                "tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-aligned in the file
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  const Bytes parts_head[] = {{len_bytes, 8}, {text.data(), text.size()}};
  std::vector<Bytes> parts(std::begin(parts_head), std::end(parts_head));
  for (size_t i = 0; i < order.size(); ++i) parts.push_back({order[i]->data, sizes[i]});
  try {
    write_file_atomic(path, parts);
  } catch (const Error& e) {
    throw Error(fmt::format("cannot write safetensors file '{}': {}", path, e.what()));
  }
}

}  // namespace loom
