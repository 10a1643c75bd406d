// Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Llama 3, SmolLM2, Qwen): read
// and run by Loom itself, since no C++ library for the format is packaged.
//
// What a file must be: model.type "BPE" with `vocab` {piece: id} and `merges` (["a", "b"] pairs or
// "a b" strings, earlier = higher priority), no unk token, no dropout, no continuing-subword prefix
// or end-of-word suffix (ignore_merges may be set: a word already in the vocabulary is one token);
// normalizer null; pre_tokenizer ByteLevel with use_regex and no prefix space (GPT-2, SmolLM2), or
// a Sequence of Split with a Regex pattern (Isolated) and ByteLevel without regex (Llama 3, Qwen
// 2); decoder ByteLevel. Anything else is a loom::Error naming the file and the field, never a
// silently different tokenization.
//
// Encoding, as the `tokenizers` library does it:
//   1. added tokens (`added_tokens`: <|endoftext|>, <|im_start|>, ...) are split out of the text
//      wherever their content occurs, longest first, and become their ids;
//   2. each remaining span is cut into words by the pre-tokenizer's regex (PCRE2, Unicode classes;
//      text between matches is a word too), for ByteLevel GPT-2's:
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   3. each word's bytes map to printable characters (GPT-2's bytes_to_unicode: a space is "Ġ"),
//      and BPE merges the adjacent pair of lowest rank until none applies;
//   4. each resulting piece is looked up in the vocabulary.
// Decoding maps each piece's characters back to bytes (added tokens to their content).
//
// A byte that is not part of well-formed UTF-8 is encoded alone, as its byte piece (tokenizers,
// taking only Unicode strings, has no such case).
//
// Invariant: decode(encode(s)) == s for every byte string s (byte-level BPE is lossless).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::data {

class HfTokenizer {
 public:
  // Reads `path` (a tokenizer.json). Throws loom::Error naming the file and field.
  static std::unique_ptr<HfTokenizer> load(const std::string& path);
  ~HfTokenizer();

  std::vector<int32_t> encode(const std::string& text) const;
  // Throws loom::Error on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  // One past the largest id (vocabulary and added tokens).
  int vocab_size() const { return vocab_size_; }

 private:
  HfTokenizer() = default;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  void encode_span(const std::string& text, std::vector<int32_t>& out) const;
  void encode_utf8(const std::string& text, std::vector<int32_t>& out) const;

  std::string path_;
  std::unordered_map<std::string, int32_t> vocab_;       // piece (byte-level characters) -> id
  std::vector<std::string> pieces_;                      // id -> piece ("" where none)
  std::vector<uint8_t> is_added_;                        // id -> 1 when an added token
  std::vector<std::pair<std::string, int32_t>> added_;   // content, id: longest first
  std::unordered_map<std::string, int32_t> merge_rank_;  // "a b" -> rank
  std::string byte_char_[256];                           // byte -> its character, UTF-8
  std::unordered_map<std::string, uint8_t> char_byte_;   // and back
  struct Regex;
  std::unique_ptr<Regex> regex_;
  int vocab_size_ = 0;
  bool ignore_merges_ = false;
};

}  // namespace loom::data
