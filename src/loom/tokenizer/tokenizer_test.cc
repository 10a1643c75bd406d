// Tests for the tokenizers: byte-level identity, and a SentencePiece BPE model trained on a small
// generated text that must round-trip text with newlines, tabs, runs of spaces and characters it
// never saw (byte fallback) exactly.
#include "loom/tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "loom/core/error.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

// ~200 KB of word salad over a small alphabet, with indentation, tabs and blank lines.
std::string make_text(uint64_t seed) {
  const char* words[] = {"the",     "model", "trains", "on",    "text", "and",
                         "tokens",  "of",    "loom",   "weave", "a",    "thread",
                         "through", "every", "shard",  "42",    "x=1;"};
  std::mt19937_64 rng(seed);
  std::string s;
  while (s.size() < 200000) {
    int indent = int(rng() % 4);
    s.append(size_t(indent * 2), ' ');
    int n = 3 + int(rng() % 9);
    for (int i = 0; i < n; ++i) {
      s += words[rng() % std::size(words)];
      uint64_t r = rng() % 10;
      s += r == 0 ? "\t" : r == 1 ? "   " : " ";
    }
    s += rng() % 7 == 0 ? "\n\n" : "\n";
  }
  return s;
}

class BpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("loom_tok_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    Tokenizer::train_bpe(make_text(1), 400, (dir_ / "tok").string(), "generated text");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path dir_;
};
fs::path BpeTest::dir_;

TEST(ByteLevel, RoundTripsAnyBytes) {
  Tokenizer t = Tokenizer::byte_level();
  EXPECT_EQ(t.vocab_size(), 256);
  std::string s = "a\n\tb  \xff\x00z";
  s.push_back('\0');
  auto ids = t.encode(s);
  ASSERT_EQ(ids.size(), s.size());
  EXPECT_EQ(ids[6], 255);
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_THROW(t.decode({256}), Error);
}

TEST_F(BpeTest, VocabularyHasTheRequestedSize) {
  Tokenizer t = Tokenizer::load((dir_ / "tok.model").string());
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_FALSE(t.is_byte_level());
}

TEST_F(BpeTest, RoundTripsWhitespaceExactly) {
  Tokenizer t = Tokenizer::load((dir_ / "tok.model").string());
  const std::string cases[] = {
      "",
      "\n",
      "\n\n\n",
      "the model trains\n",
      "  leading spaces and trailing   \n",
      "\ttab\tseparated\t\tfields\n",
      "a    run     of      spaces",
      " \n \n\t\n",
      "unseen: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 ~{}|\n",  // café € 😀: byte fallback
      "line one\r\nline two\r\n",
  };
  for (const std::string& s : cases) {
    auto ids = t.encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.vocab_size()) << id;
    EXPECT_EQ(t.decode(ids), s) << "input: [" << s << "]";
  }
}

TEST_F(BpeTest, RoundTripsAHeldOutTextAndCompressesIt) {
  Tokenizer t = Tokenizer::load((dir_ / "tok.model").string());
  std::string s = make_text(2);
  auto ids = t.encode(s);
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_LT(ids.size() * 2, s.size()) << "BPE should merge at least 2 bytes per token here";
}

TEST_F(BpeTest, NewlineIsItsOwnPiece) {
  Tokenizer t = Tokenizer::load((dir_ / "tok.model").string());
  auto a = t.encode("the model\n");
  auto b = t.encode("\n");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a.back(), b[0]);
}

TEST(Bpe, TooLargeAVocabularyIsAnError) {
  auto dir = fs::temp_directory_path() / ("loom_tok_big_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    Tokenizer::train_bpe(std::string("ab ab ab\n"), 5000, (dir / "tok").string(), "tiny.txt");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny.txt"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Bpe, LoadNamesAMissingFile) {
  try {
    Tokenizer::load("/nonexistent/tok.model");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tok.model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::data
