// A Hugging Face byte-level BPE tokenizer.json, written here by hand (256 byte pieces, a few
// merges, an added token): encoding follows GPT-2's pre-tokenizer and the merge ranks, added tokens
// split out, bytes that are not UTF-8 encode alone, decode inverts encode, and files Loom cannot
// run exactly are errors naming the field. tests/hf_tokenizer_test.py checks a real one (SmolLM2's)
// against the tokenizers library on the whole corpus.
#include "loom/tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/testing.h"
#include "loom/tokenizer/tokenizer.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

// GPT-2's byte -> character map, written independently of the implementation: the printable
// Latin-1 bytes are themselves, the rest take U+0100 on, in byte order.
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    auto utf8 = [](int cp) {
      std::string s;
      if (cp < 0x80) {
        s += char(cp);
      } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
      }
      return s;
    };
    for (int i = 0; i < 256; ++i) {
      bool keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174;
      t[size_t(i)] = utf8(keep ? i : next++);
    }
    return t;
  }();
  return table[size_t(b)];
}

struct HfTokenizerTest : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("loom_hf_tok_test_" + std::to_string(::getpid()));
  nlohmann::json j;
  void SetUp() override {
    fs::create_directories(dir);
    nlohmann::json vocab;
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    const std::string sp = byte_char(' ');  // "Ġ"
    // merges, best first: "t h" -> "th", "th e" -> "the", "Ġ the" -> "Ġthe", "l o" -> "lo"
    vocab["th"] = 256;
    vocab["the"] = 257;
    vocab[sp + "the"] = 258;
    vocab["lo"] = 259;
    j = {{"version", "1.0"},
         {"added_tokens", {{{"id", 260}, {"content", "<|end|>"}, {"special", true}}}},
         {"normalizer", nullptr},
         {"pre_tokenizer",
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
         {"decoder", {{"type", "ByteLevel"}}},
         {"model",
          {{"type", "BPE"},
           {"dropout", nullptr},
           {"unk_token", nullptr},
           {"vocab", vocab},
           {"merges", {{"t", "h"}, {"th", "e"}, {sp, "the"}, "l o"}}}}};
  }
  void TearDown() override { fs::remove_all(dir); }
  std::unique_ptr<HfTokenizer> load() {
    write_file_atomic((dir / "tokenizer.json").string(), j.dump());
    return HfTokenizer::load((dir / "tokenizer.json").string());
  }
  std::string error(const nlohmann::json& changed) {
    j = changed;
    return error_of([&] { load(); });
  }
};

TEST_F(HfTokenizerTest, EncodesByPreTokenizerAndMergeRank) {
  auto t = load();
  EXPECT_EQ(t->vocab_size(), 261);
  // "the the": words "the", " the"; "hello" has "lo" merged; "'s" is a word of its own
  using V = std::vector<int32_t>;
  EXPECT_EQ(t->encode("the the"), (V{257, 258}));
  EXPECT_EQ(t->encode("hello"), (V{'h', 'e', 'l', 259}));
  EXPECT_EQ(t->encode("it's"), (V{'i', 't', 0x27, 's'}));
  // runs of spaces: all but the last stay one word, the last joins the next word
  EXPECT_EQ(t->encode("a   the"), (V{'a', ' ', ' ', 258}));
  // added tokens split out wherever they occur
  EXPECT_EQ(t->encode("the<|end|>the"), (V{257, 260, 257}));
  // a Latin-1 byte (not UTF-8) is encoded alone, and everything round-trips
  for (const std::string s : {"the the", "hello, world!\n\n  x\t", "caf\xe9 the",
                              "\xc3\xa9t\xc3\xa9", "<|end|>", "12 345 \xf0\x9f\x98\x80 ok"})
    EXPECT_EQ(t->decode(t->encode(s)), s);
  EXPECT_EQ(t->encode("caf\xe9"), (V{'c', 'a', 'f', 0xe9}));
  EXPECT_THROW(t->decode({261}), Error);
  // through Tokenizer, by the .json name
  Tokenizer tok = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_FALSE(tok.is_byte_level());
  EXPECT_EQ(tok.vocab_size(), 261);
  EXPECT_EQ(tok.encode("the the"), (V{257, 258}));
}

TEST_F(HfTokenizerTest, LlamaThreeLayoutSplitsByItsOwnRegexAndHonoursIgnoreMerges) {
  using V = std::vector<int32_t>;
  // "hello" is in the vocabulary but no merge builds it (only "l o" does)
  j["model"]["vocab"]["hello"] = 261;
  EXPECT_EQ(load()->encode("hello"), (V{'h', 'e', 'l', 259}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load()->encode("hello"), (V{261}));
  EXPECT_EQ(load()->encode("hellos"), (V{'h', 'e', 'l', 259, 's'}));  // not a vocabulary word
  // Sequence[Split(digits one by one, Isolated), ByteLevel without regex]: "the" runs are not
  // split at spaces by GPT-2's regex any more, only the digits are cut out
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\p{N}"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  auto t = load();
  EXPECT_EQ(t->encode("the the"), (V{257, 258}));  // one word "the the": merges give the, Ġthe
  EXPECT_EQ(t->encode("a12"), (V{'a', '1', '2'}));
  EXPECT_EQ(t->decode(t->encode("x 12 the\n")), "x 12 the\n");
  // a pattern PCRE2 cannot compile is named
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error(j).find("pre_tokenizer: the pattern does not compile"), std::string::npos);
}

TEST_F(HfTokenizerTest, WhatLoomCannotRunExactlyIsAnErrorNamingTheField) {
  nlohmann::json base = j;
  nlohmann::json c = base;
  c["normalizer"] = {{"type", "NFC"}};
  EXPECT_NE(error(c).find("normalizer = {\"type\":\"NFC\"}: Loom applies no normalizer"),
            std::string::npos);
  c = base;
  c["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(error(c).find("pre_tokenizer = "), std::string::npos);
  c = base;
  c["model"]["type"] = "Unigram";
  EXPECT_NE(error(c).find("model.type = \"Unigram\": Loom reads BPE models only"),
            std::string::npos);
  c = base;
  c["model"]["merges"][1] = 7;
  EXPECT_NE(error(c).find("model.merges[1] = 7"), std::string::npos);
  c = base;
  c["model"]["vocab"]["x"] = -3;
  EXPECT_NE(error(c).find("id -3 is not a non-negative integer"), std::string::npos);
  // a field of the wrong type is named (never a JSON library's exception), wherever it is
  c = base;
  c["pre_tokenizer"]["type"] = 5;
  EXPECT_NE(error(c).find("pre_tokenizer.type = 5: expected a string"), std::string::npos)
      << error(c);
  c = base;
  c["pre_tokenizer"]["use_regex"] = "yes";
  EXPECT_NE(error(c).find("pre_tokenizer.use_regex = \"yes\": expected true or false"),
            std::string::npos)
      << error(c);
  c = base;
  c["decoder"]["type"] = nlohmann::json::array();
  EXPECT_NE(error(c).find("decoder.type = []: expected a string"), std::string::npos) << error(c);
  c = base;
  c["model"]["ignore_merges"] = 1;
  EXPECT_NE(error(c).find("model.ignore_merges = 1: expected true or false"), std::string::npos)
      << error(c);
  // merges and ids the tokenizers library refuses too: a merge not of two pieces, pieces or a
  // result outside the vocabulary, two pieces with one id
  c = base;
  c["model"]["merges"][3] = "lo";
  EXPECT_NE(error(c).find("model.merges[3] = \"lo\": expected"), std::string::npos) << error(c);
  c = base;
  c["model"]["merges"][3] = {"q", "z"};
  EXPECT_NE(error(c).find("model.merges[3] = [\"q\",\"z\"]: 'qz' is not in model.vocab"),
            std::string::npos)
      << error(c);
  c = base;
  c["model"]["vocab"]["dup"] = c["model"]["vocab"]["th"];
  EXPECT_NE(error(c).find("model.vocab gives id"), std::string::npos) << error(c);
  // an id far beyond the entries would size the tables by it (2^31 - 1: tens of gigabytes)
  c = base;
  c["model"]["vocab"]["x"] = 2147483647;
  EXPECT_NE(error(c).find("id 2147483647 is beyond the 261 entries"), std::string::npos)
      << error(c);
  j = base;
  write_file_atomic((dir / "tokenizer.json").string(), "{\"model\": ");
  const std::string e = error_of([&] { HfTokenizer::load((dir / "tokenizer.json").string()); });
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << "a truncated file: " << e;
}

}  // namespace
}  // namespace loom::data
