// Tests for token shards: round trips in both dtypes, the header layout, and one test per
// validation error (each message names the file).
#include "loom/data/shard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loom/core/error.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_shard_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string error_of(const std::string& p) {
    try {
      Shard::open(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static void cut(const std::string& p, size_t bytes) { fs::resize_file(p, bytes); }
  fs::path dir_;
};

TEST_F(ShardTest, RoundTripU16) {
  std::vector<int32_t> toks{7, 1, 300, 0, 511};
  write_shard(path("a.bin"), toks, 512);
  EXPECT_EQ(fs::file_size(path("a.bin")), 32u + 5 * 2);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
  Shard s = Shard::open(path("a.bin"));
  EXPECT_EQ(s.dtype(), ShardDType::u16);
  EXPECT_EQ(s.vocab_size(), 512);
  ASSERT_EQ(s.size(), 5);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(s[i], toks[size_t(i)]);
  Shard moved = std::move(s);
  EXPECT_EQ(moved[2], 300);
}

TEST_F(ShardTest, RoundTripI32ForLargeVocabularies) {
  std::vector<int32_t> toks{70000, 3, 99999};
  write_shard(path("b.bin"), toks, 100000);
  Shard s = Shard::open(path("b.bin"));
  EXPECT_EQ(s.dtype(), ShardDType::i32);
  EXPECT_EQ(fs::file_size(path("b.bin")), 32u + 3 * 4);
  EXPECT_EQ(s[0], 70000);
  EXPECT_EQ(s[2], 99999);
}

TEST_F(ShardTest, EmptyShard) {
  write_shard(path("e.bin"), {}, 256);
  EXPECT_EQ(Shard::open(path("e.bin")).size(), 0);
}

// A shard that changes on disk after it was opened (truncated, or rewritten in place, even with
// tokens the vocabulary holds) is an error naming it at the next read, wherever it reads: never
// SIGBUS (a mapping's fate), a token outside the vocabulary, or training on other tokens. Each
// shard's modification time is set an hour back before it is opened, so that a write moves it
// however coarse the file system's clock.
TEST_F(ShardTest, ChangedWhileOpenIsAnErrorNotACrash) {
  std::vector<int32_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i % 500);
  auto open_aged = [&](const std::string& p) {
    write_shard(p, toks, 512);
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::hours(1));
    return Shard::open(p);
  };
  auto expect_error = [&](const Shard& s, int64_t at, const std::string& what) {
    std::vector<int32_t> got(10);
    try {
      s.read(at, 10, got.data());
      ADD_FAILURE() << s.path() << ": read at " << at << " after the change";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(s.path()), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  Shard s = open_aged(path("c.bin"));
  std::vector<int32_t> got(10);
  s.read(990, 10, got.data());
  EXPECT_EQ(got[9], 999 % 500);
  cut(path("c.bin"), 32 + 2 * 500);  // half of it gone
  for (int64_t at : {int64_t(0), int64_t(495), int64_t(990)})
    expect_error(s, at, "1032 bytes, 2032 when it was opened");
  // rewritten in place: with a token the vocabulary holds, and with one it does not
  for (const uint16_t token : {uint16_t(3), uint16_t(60000)}) {
    Shard d = open_aged(path("d.bin"));
    d.read(0, 10, got.data());
    {
      std::FILE* f = std::fopen(path("d.bin").c_str(), "r+b");
      ASSERT_NE(f, nullptr);
      std::fseek(f, 32 + 2 * 7, SEEK_SET);
      std::fwrite(&token, 2, 1, f);
      std::fclose(f);
    }
    for (int64_t at : {int64_t(0), int64_t(500)})
      expect_error(d, at, "written to since it was opened");
  }
}

TEST_F(ShardTest, TruncatedNamesFileAndSizes) {
  write_shard(path("t.bin"), std::vector<int32_t>(100, 5), 256);
  cut(path("t.bin"), 32 + 150);
  std::string e = error_of(path("t.bin"));
  EXPECT_NE(e.find(path("t.bin")), std::string::npos) << e;
  EXPECT_NE(e.find("expected 232 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("182"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(ShardTest, ShorterThanHeader) {
  write_shard(path("h.bin"), {1, 2}, 256);
  cut(path("h.bin"), 10);
  std::string e = error_of(path("h.bin"));
  EXPECT_NE(e.find(path("h.bin")), std::string::npos) << e;
  EXPECT_NE(e.find("header"), std::string::npos) << e;
}

TEST_F(ShardTest, BadMagicVersionDtype) {
  write_shard(path("m.bin"), {1, 2}, 256);
  auto patch = [&](long off, const std::string& bytes) {
    std::fstream f(path("m.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(off);
    f.write(bytes.data(), long(bytes.size()));
  };
  patch(0, "NOTATOKN");
  EXPECT_NE(error_of(path("m.bin")).find("magic"), std::string::npos);
  patch(0, "LOOMTOK1");
  patch(8, std::string("\x02\0\0\0", 4));
  EXPECT_NE(error_of(path("m.bin")).find("version 2"), std::string::npos);
  patch(8, std::string("\x01\0\0\0", 4));
  patch(12, std::string("\x09\0\0\0", 4));
  EXPECT_NE(error_of(path("m.bin")).find("dtype code 9"), std::string::npos);
}

TEST_F(ShardTest, TokenOutsideVocabulary) {
  write_shard(path("v.bin"), {1, 2, 300}, 512);
  std::fstream f(path("v.bin"), std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(24);
  f.write("\x00\x01\0\0", 4);  // vocab 256
  f.close();
  std::string e = error_of(path("v.bin"));
  EXPECT_NE(e.find("token 300 at index 2"), std::string::npos) << e;
}

// found by fuzz/targets/token_shard.cc: a header's vocab_size beyond int32 let i32 tokens up to
// 2^32-1 through, which no model can embed
TEST_F(ShardTest, VocabularyOutsideInt32OrZero) {
  write_shard(path("w.bin"), {1, 2}, 100000);
  for (const char* vocab : {"\x00\x00\x00\x80", "\xff\xff\xff\xff", "\x00\x00\x00\x00"}) {
    std::fstream f(path("w.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24);
    f.write(vocab, 4);
    f.close();
    std::string e = error_of(path("w.bin"));
    EXPECT_NE(e.find("vocab_size"), std::string::npos) << e;
    EXPECT_NE(e.find("not in [1, 2^31-1]"), std::string::npos) << e;
  }
}

TEST_F(ShardTest, MissingFile) {
  std::string e = error_of(path("none.bin"));
  EXPECT_NE(e.find(path("none.bin")), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::data
