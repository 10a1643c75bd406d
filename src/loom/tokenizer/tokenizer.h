// Tokenizers: text <-> token ids. Three kinds: byte-level (id = byte value, vocabulary 256, nothing
// to train), SentencePiece BPE (trained by `loom data prepare`, saved as tokenizer.model), and a
// Hugging Face byte-level BPE tokenizer.json (a pretrained model's: hf_tokenizer.h).
//
// Invariant: decode(encode(s)) == s for every byte string s, newlines, tabs and runs of spaces
// included. SentencePiece drops or folds whitespace by default; train_bpe turns that off (identity
// normalization, no extra-whitespace removal, no dummy prefix, "\n" as its own piece, byte fallback
// for anything outside the vocabulary).
//
// Not here: special tokens (BOS/EOS/padding) for the first two kinds; tokenizer.json's added tokens
// are encoded where their text occurs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace loom::data {

class HfTokenizer;

class Tokenizer {
 public:
  static Tokenizer byte_level();
  // A SentencePiece model file, or a Hugging Face tokenizer.json (by the .json extension). Throws
  // loom::Error naming the path if it cannot be read.
  static Tokenizer load(const std::string& path);
  // Trains a BPE model of exactly `vocab_size` pieces on `text` (its lines are the training
  // sentences) and writes `model_prefix`.model (and .vocab). Throws loom::Error, naming `what` (the
  // input's name for messages), when SentencePiece refuses, e.g. a vocabulary too large for the
  // text.
  static void train_bpe(const std::string& text, int vocab_size, const std::string& model_prefix,
                        const std::string& what);
  // The same, reading the text from files (concatenated).
  static void train_bpe(const std::vector<std::string>& text_files, int vocab_size,
                        const std::string& model_prefix);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(const std::string& text) const;
  // Throws loom::Error on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  int vocab_size() const;
  bool is_byte_level() const { return !sp_ && !hf_; }

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // both null: byte-level
  std::unique_ptr<HfTokenizer> hf_;
};

}  // namespace loom::data
