// Tests for the safetensors reader/writer: round trips, byte-exact agreement with the Hugging Face
// library's own golden files, one test per validation error, and the atomic writer's cleanup.
//
// Cross-check with PyTorch's reader (not run here: Debian packages neither safetensors nor torch,
// and Loom adds no Python dependency). With `pip install torch safetensors`, after running this
// test with LOOM_ST_KEEP=1, which leaves /tmp/loom_st_compat.safetensors behind:
//
//   import torch
//   from safetensors import safe_open
//   from safetensors.torch import load_file, save_file
//   p = "/tmp/loom_st_compat.safetensors"
//   t = load_file(p)  # Rust-side checks: header length, no holes or overlaps, sizes match shapes
//   assert torch.equal(t["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
//   assert torch.equal(t["ids"], torch.tensor([7, -8], dtype=torch.int32))
//   assert t["scalar"].shape == () and t["scalar"].item() == 2.5 and t["empty"].shape == (0, 4)
//   assert torch.equal(t["h"], torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16))
//   with safe_open(p, framework="pt") as f:
//       assert f.metadata() == {"step": "12", "format": "pt"}
//   # The other way round: SafetensorsFile::open this file (HF writes a, b, c: by dtype, name).
//   save_file({"a": torch.ones(3), "b": torch.arange(5, dtype=torch.int32),
//              "c": torch.zeros(3, dtype=torch.bfloat16)}, "/tmp/hf.safetensors", {"k": "v"})
//
// What runs here instead: MatchesHuggingFaceBytes compares the writer byte for byte with the
// expected outputs in the Hugging Face library's own tests, and the reader opens them.
//
// Not tested: a full disk (ENOSPC) itself. A write error is simulated with RLIMIT_FSIZE (EFBIG)
// instead, and a failing rename by a directory standing at the target path; read-only directories
// do not stop root, which runs these tests.
#include "loom/core/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/testing.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(uint8_t(n >> (8 * i)));
  return s;
}

// A file with this header text and data buffer, the length field computed unless given.
std::string raw_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_st_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  // Names in the test directory: shows a leftover temp file.
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }

  // Writes raw bytes to `name` and expects open() to throw an Error containing each needle and the
  // path; returns the message.
  std::string expect_open_error(const std::string& bytes, std::vector<std::string> needles) {
    std::string path = file("bad.safetensors");
    write_bytes(path, bytes);
    needles.push_back(path);
    try {
      SafetensorsFile::open(path);
    } catch (const Error& e) {
      std::string msg = e.what();
      for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << n << " in: " << msg;
      return msg;
    }
    ADD_FAILURE() << "no error for " << bytes.substr(8);
    return "";
  }

  std::string dir_;
};

// The tensors of the round-trip tests. bf16 h has an odd element count, so it would misalign the
// f32 after it if the writer kept the given order.
struct Sample {
  std::vector<float> w{0, 1, 2, 3, 4, 5};
  std::vector<uint16_t> h{f32_to_bf16(1.5f).bits, f32_to_bf16(-2.0f).bits, f32_to_bf16(3.25f).bits};
  std::vector<int32_t> ids{7, -8};
  float scalar = 2.5f;
  std::vector<float> empty;

  std::vector<TensorToWrite> tensors() const {
    return {{"h", DType::bf16, {3}, h.data()},
            {"w", DType::f32, {2, 3}, w.data()},
            {"ids", DType::i32, {2}, ids.data()},
            {"scalar", DType::f32, {}, &scalar},
            {"empty", DType::f32, {0, 4}, empty.data()}};
  }
};

void expect_sample(const SafetensorsFile& f, const Sample& s) {
  // Descending element size, then given order: w, ids, scalar, empty (4 bytes), h (2 bytes).
  EXPECT_EQ(f.names(), (std::vector<std::string>{"w", "ids", "scalar", "empty", "h"}));
  const TensorView& w = f.get("w");
  EXPECT_EQ(w.dtype, DType::f32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(w.nbytes, 24u);
  EXPECT_EQ(std::memcmp(w.data, s.w.data(), 24), 0);
  const TensorView& h = f.get("h");
  EXPECT_EQ(h.dtype, DType::bf16);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{3}));
  ASSERT_EQ(h.nbytes, 6u);
  EXPECT_EQ(bf16_to_f32(static_cast<const bf16*>(h.data)[2]), 3.25f);
  const TensorView& ids = f.get("ids");
  EXPECT_EQ(ids.dtype, DType::i32);
  ASSERT_EQ(ids.nbytes, 8u);
  EXPECT_EQ(static_cast<const int32_t*>(ids.data)[1], -8);
  const TensorView& sc = f.get("scalar");
  EXPECT_TRUE(sc.shape.empty());
  ASSERT_EQ(sc.nbytes, 4u);
  EXPECT_EQ(*static_cast<const float*>(sc.data), 2.5f);
  const TensorView& e = f.get("empty");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(e.nbytes, 0u);
  for (const auto& name : f.names()) {
    const TensorView& t = f.get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name;
  }
}

TEST_F(SafetensorsTest, RoundTripWithoutMetadata) {
  Sample s;
  std::string path = file("a.safetensors");
  write_safetensors(path, s.tensors(), {}, /*checksums=*/false);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
  std::string bytes = read_bytes(path);
  EXPECT_EQ(bytes.find("__metadata__"), std::string::npos);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 8 + 4 + 0 + 6);

  SafetensorsFile f = SafetensorsFile::open(path);
  expect_sample(f, s);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.path(), path);
  EXPECT_TRUE(f.contains("w"));
  EXPECT_FALSE(f.contains("W"));
}

TEST_F(SafetensorsTest, RoundTripWithMetadataAndMove) {
  Sample s;
  std::string path = file("a.safetensors");
  std::map<std::string, std::string> meta{{"step", "12"}, {"format", "pt"}};
  write_safetensors(path, s.tensors(), meta, /*checksums=*/false);
  SafetensorsFile f = SafetensorsFile::open(path);
  SafetensorsFile g = std::move(f);  // views stay valid: they point into heap buffers
  expect_sample(g, s);
  EXPECT_EQ(g.metadata(), meta);
  if (std::getenv("LOOM_ST_KEEP"))
    fs::copy_file(path, "/tmp/loom_st_compat.safetensors", fs::copy_options::overwrite_existing);
}

TEST_F(SafetensorsTest, OverwritesAtomically) {
  std::string path = file("a.safetensors");
  float one = 1, two = 2;
  write_safetensors(path, {{"x", DType::f32, {}, &one}});
  write_safetensors(path, {{"y", DType::f32, {}, &two}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), std::vector<std::string>{"y"});
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
}

// Byte-exact against the expected outputs in Hugging Face's safetensors/src/tensor.rs tests
// (test_empty, test_serialization, test_serialization_forced_alignement).
TEST_F(SafetensorsTest, MatchesHuggingFaceBytes) {
  std::string path = file("hf.safetensors");
  write_safetensors(path, {}, {}, false);
  EXPECT_EQ(read_bytes(path), u64_le(8) + "{}      ");
  EXPECT_TRUE(SafetensorsFile::open(path).names().empty());

  write_safetensors(path, {}, {{"framework", "pt"}}, false);
  EXPECT_EQ(read_bytes(path), u64_le(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
  EXPECT_EQ(SafetensorsFile::open(path).metadata().at("framework"), "pt");

  std::vector<float> v{0, 1, 2, 3, 4, 5};
  write_safetensors(path, {{"attn.0", DType::f32, {1, 2, 3}, v.data()}}, {}, false);
  EXPECT_EQ(read_bytes(path),
            u64_le(64) + R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})" +
                f32_bytes({0, 1, 2, 3, 4, 5}));

  write_safetensors(path, {{"attn0", DType::f32, {1, 1, 2, 3}, v.data()}}, {}, false);
  EXPECT_EQ(read_bytes(path),
            u64_le(72) + R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                "       " + f32_bytes({0, 1, 2, 3, 4, 5}));
}

// Every tensor Loom writes carries its CRC-32; a flipped bit anywhere in a tensor's data, or in a
// recorded checksum, is refused naming the file and the tensor. A file without checksums (another
// writer's) reads as before.
TEST_F(SafetensorsTest, ChecksumsCatchDamage) {
  Sample s;
  std::string path = file("c.safetensors");
  write_safetensors(path, s.tensors(), {{"step", "3"}});
  const std::string whole = read_bytes(path);
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    expect_sample(f, s);
    EXPECT_EQ(f.metadata().at("step"), "3");
    EXPECT_EQ(f.metadata().at("loom.crc32.w").size(), 8u);
    EXPECT_EQ(f.metadata().count("loom.crc32.ids"), 1u);
  }
  uint64_t n;
  std::memcpy(&n, whole.data(), 8);
  const size_t data0 = 8 + size_t(n);
  int refused = 0;
  // every byte of the data buffer, one bit each (tensors w, ids, scalar, h)
  for (size_t at = data0; at < whole.size(); ++at) {
    std::string bad = whole;
    bad[at] = char(bad[at] ^ (1 << (at % 8)));
    write_bytes(path, bad);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "a flipped bit at byte " << at << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("fails the checksum"), std::string::npos) << msg;
      EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
      ++refused;
    }
  }
  EXPECT_EQ(refused, int(whole.size() - data0));
  // a damaged recorded checksum: the tensor it names is refused
  std::string bad = whole;
  const size_t at = bad.find("loom.crc32.w\":\"") + 15;
  bad[at] = bad[at] == '0' ? '1' : '0';
  expect_open_error(bad, {"tensor 'w'", "fails the checksum"});
  // no checksums: read as written
  write_safetensors(path, s.tensors(), {}, /*checksums=*/false);
  expect_sample(SafetensorsFile::open(path), s);
}

// open_lazy reads the header alone: get() then reads a tensor when first asked (the same values as
// open()), read() copies one into caller memory; a flipped bit in a tensor is refused when that
// tensor is read, naming the file and tensor, while the others still read; a bad header is refused
// at open_lazy as at open.
TEST_F(SafetensorsTest, LazyReadsEachTensorWhenAsked) {
  Sample s;
  std::string path = file("lazy.safetensors");
  write_safetensors(path, s.tensors());
  {
    SafetensorsFile f = SafetensorsFile::open_lazy(path);
    expect_sample(f, s);
    std::vector<float> w(s.w.size());
    f.read("w", w.data());
    EXPECT_EQ(w, s.w);
    EXPECT_NE(error_of([&] { f.read("nope", w.data()); }).find("'nope'"), std::string::npos);
  }
  const std::string whole = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, whole.data(), 8);
  std::string bad = whole;
  bad[8 + size_t(n)] = char(bad[8 + size_t(n)] ^ 1);  // the first data byte: w's (f32 sorts first)
  write_bytes(path, bad);
  SafetensorsFile f = SafetensorsFile::open_lazy(path);
  std::vector<float> w(s.w.size());
  const std::string e = error_of([&] { f.read("w", w.data()); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("fails the checksum"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { f.get("w"); }).find("fails the checksum"), std::string::npos);
  EXPECT_EQ(f.get("h").nbytes, s.h.size() * 2);
  write_bytes(path, whole.substr(0, 4));
  EXPECT_NE(error_of([&] { SafetensorsFile::open_lazy(path); }).find("shorter than the 8-byte"),
            std::string::npos);
}

TEST_F(SafetensorsTest, ReadsForeignLayouts) {
  // Entries out of offset order, no padding, and an f32 at odd offset 2: names() follows offsets,
  // and the misaligned tensor is copied so its pointer is still 4-aligned.
  std::string path = file("foreign.safetensors");
  std::string data = std::string("\x80\x3f", 2) + f32_bytes({6.5f});
  write_bytes(path, raw_file(R"( {"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]},)"
                             R"("a":{"shape":[1],"data_offsets":[0,2],"dtype":"BF16"}} )",
                             data));
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(bf16_to_f32(*static_cast<const bf16*>(f.get("a").data)), 1.0f);
  const TensorView& b = f.get("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 4, 0u);
  EXPECT_EQ(*static_cast<const float*>(b.data), 6.5f);
}

// ---- read errors -------------------------------------------------------------------------------

const char* kGoodHeader = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
const std::string kGoodData = f32_bytes({1, 2});

TEST_F(SafetensorsTest, ErrorMissingFile) {
  std::string path = file("nope.safetensors");
  try {
    SafetensorsFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ENOENT"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile::open(dir_), Error);  // a directory
}

TEST_F(SafetensorsTest, ErrorShortFile) {
  expect_open_error("", {"0 bytes", "shorter than"});
  expect_open_error(std::string("\x08\0\0", 3), {"3 bytes"});
}

TEST_F(SafetensorsTest, ErrorHeaderLength) {
  std::string good = raw_file(kGoodHeader, kGoodData);
  std::string flipped = good;
  flipped[7] = '\x01';  // length becomes 2^56 + ...
  expect_open_error(flipped, {"header length", "larger than"});
  expect_open_error(u64_le(good.size() + 1) + good, {"header length", "larger than"});
  // Past Hugging Face's 100 MB header limit, in a sparse file that really is that long.
  std::string path = file("huge.safetensors");
  write_bytes(path, u64_le(100'000'001));
  fs::resize_file(path, 8 + 100'000'001);
  try {
    SafetensorsFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the 100000000 byte limit"), std::string::npos)
        << e.what();
  }
}

TEST_F(SafetensorsTest, ErrorHeaderNotJsonObject) {
  expect_open_error(raw_file("{\"w\": [1,", ""), {"not valid JSON"});
  expect_open_error(raw_file("\x01\x02garbage", ""), {"not valid JSON"});
  expect_open_error(raw_file("{\"a\xff\": 1}", ""), {"not valid JSON"});  // bad UTF-8
  expect_open_error(raw_file("[1, 2]", ""), {"array, not an object"});
  expect_open_error(raw_file("\"x\"", ""), {"string, not an object"});
}

TEST_F(SafetensorsTest, ErrorEntryShape) {
  expect_open_error(raw_file(R"({"w": 3})", ""), {"'w'", "not an object"});
  expect_open_error(raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", kGoodData),
                    {"'w'", "missing \"dtype\""});
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", kGoodData),
                    {"'w'", "missing \"shape\""});
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", kGoodData),
                    {"'w'", "missing \"data_offsets\""});
  expect_open_error(raw_file(R"({"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", kGoodData),
                    {"'w'", "\"dtype\" is a"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", kGoodData),
      {"'w'", "\"shape\" is a string"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", kGoodData),
      {"'w'", "float"});
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", kGoodData),
                    {"'w'", "data_offsets"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})", kGoodData),
      {"'w'", "data_offsets"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", kGoodData),
      {"'w'", "data_offsets"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offsets":[0,8]}})",
               kGoodData),
      {"'w'", "unknown key \"offsets\""});
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                             kGoodData),
                    {"\"w\" twice"});
}

TEST_F(SafetensorsTest, ErrorDtype) {
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", kGoodData),
      {"'w'", "F16 is not supported"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", kGoodData),
      {"'w'", "I64 is not supported"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", kGoodData),
      {"'w'", "unknown dtype \"f32\""});
}

TEST_F(SafetensorsTest, ErrorShapeAndOffsets) {
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", kGoodData),
      {"'w'", "negative dimension -2"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", kGoodData),
      {"'w'", "end before they begin"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", kGoodData),
      {"'w'", "span 8 bytes", "needs 12"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
               kGoodData),
      {"'w'", "overflows"});
}

TEST_F(SafetensorsTest, ErrorTruncated) {
  std::string path = file("t.safetensors");
  Sample s;
  write_safetensors(path, s.tensors());
  std::string good = read_bytes(path);
  // The last tensor in the file is h (bf16, 6 bytes): cutting one byte leaves it short.
  expect_open_error(good.substr(0, good.size() - 1), {"'h'", "truncated", "past the end"});
  // Cut inside the header.
  expect_open_error(good.substr(0, 20), {"header length", "larger than"});
}

TEST_F(SafetensorsTest, ErrorLayout) {
  expect_open_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             kGoodData),
                    {"'b'", "overlap tensor 'a'"});
  expect_open_error(
      raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", kGoodData),
      {"'a'", "hole of 4 bytes"});
  expect_open_error(raw_file(kGoodHeader, kGoodData + "xyz"), {"3 bytes after the last tensor"});
  expect_open_error(raw_file("{}", "x"), {"1 bytes after"});
}

TEST_F(SafetensorsTest, ErrorMetadata) {
  expect_open_error(raw_file(R"({"__metadata__":[1]})", ""), {"\"__metadata__\" is a array"});
  expect_open_error(raw_file(R"({"__metadata__":{"step":12}})", ""), {"\"step\"", "holds a"});
}

TEST_F(SafetensorsTest, ErrorGetMissingTensor) {
  std::string path = file("a.safetensors");
  write_bytes(path, raw_file(kGoodHeader, kGoodData));
  SafetensorsFile f = SafetensorsFile::open(path);
  try {
    f.get("v");
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("'v'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint: tensors in the file (1): 'w'"), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsTest, CorruptedFilesNeverCrash) {
  // Random byte flips and truncations of a good file: open() either succeeds or throws loom::Error.
  // Under ASan this also checks no read strays outside the buffers.
  std::string path = file("a.safetensors");
  Sample s;
  write_safetensors(path, s.tensors(), {{"k", "v"}});
  const std::string good = read_bytes(path);
  const uint32_t seed = 20240611;
  std::mt19937 rng(seed);
  int opened = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string bad = good;
    if (rng() % 4 == 0) {
      bad.resize(rng() % good.size());
    } else {
      for (int k = 1 + rng() % 3; k > 0; --k) bad[rng() % bad.size()] = char(rng());
    }
    write_bytes(path, bad);
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      for (const auto& name : f.names()) {
        const TensorView& t = f.get(name);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u);
      }
      ++opened;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  std::printf(
      "seed %u: %d of 1000 corrupted files still opened (the flips left the header valid)\n", seed,
      opened);
}

// ---- write errors ------------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriteIntoMissingDirectory) {
  std::string path = file("no/such/dir/a.safetensors");
  float x = 1;
  try {
    write_safetensors(path, {{"x", DType::f32, {}, &x}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ENOENT"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(SafetensorsTest, ADirectoryAtThePathIsRefusedBeforeAnythingIsWritten) {
  // A non-empty directory at PATH: refused before the temp file is made (rename() would fail
  // with EISDIR after writing it; a device or FIFO it would replace).
  std::string path = file("a.safetensors");
  fs::create_directory(path);
  write_bytes(path + "/keep", "x");
  float x = 1;
  try {
    write_safetensors(path, {{"x", DType::f32, {}, &x}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '" + path + "'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("not a regular file (a directory)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
  EXPECT_TRUE(fs::exists(path + "/keep"));
}

TEST_F(SafetensorsTest, FailedWriteKeepsOldFile) {
  // RLIMIT_FSIZE makes write() fail with EFBIG part-way through the temp file, standing in for
  // ENOSPC; the old file at PATH must survive byte for byte.
  std::string path = file("a.safetensors");
  float x = 1;
  write_safetensors(path, {{"x", DType::f32, {}, &x}});
  std::string before = read_bytes(path);
  std::vector<float> big(1 << 20);

  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 << 10;
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills us instead of EFBIG
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    write_safetensors(path, {{"big", DType::f32, {1 << 20}, big.data()}});
  } catch (const Error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("EFBIG"), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
}

TEST_F(SafetensorsTest, WriteRejectsBadNames) {
  std::string path = file("a.safetensors");
  float x = 1;
  EXPECT_THROW(write_safetensors(path, {{"x", DType::f32, {}, &x}, {"x", DType::f32, {}, &x}}),
               Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", DType::f32, {}, &x}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"bad\xff", DType::f32, {}, &x}}), Error);
  EXPECT_TRUE(listing().empty());
}

}  // namespace
}  // namespace loom
