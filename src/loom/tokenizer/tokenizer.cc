#include "loom/tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <thread>
#include <unordered_map>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/tokenizer/hf_tokenizer.h"

namespace loom::data {

namespace {

constexpr size_t kMaxSentenceBytes =
    8192;                                 // longer lines are cut (at a UTF-8 boundary) for training
constexpr size_t kEncodeChunk = 1 << 20;  // encode() works on ~1 MiB pieces ending in a newline

// Feeds SentencePiece the lines of an in-memory text. A line longer than kMaxSentenceBytes is cut
// into several sentences rather than skipped (SentencePiece skips over-long sentences).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    for (;;) {
      if (pos_ >= text_.size()) {
        done_ = true;
        return;
      }
      size_t nl = text_.find('\n', pos_);
      size_t end = nl == std::string::npos ? text_.size() : nl;
      size_t take = std::min(end - pos_, kMaxSentenceBytes);
      if (pos_ + take < end)  // cut inside a line: back up to a UTF-8 character boundary
        while (take > 1 && (uint8_t(text_[pos_ + take]) & 0xC0) == 0x80) --take;
      value_.assign(text_, pos_, take);
      pos_ += take;
      if (pos_ == nl) ++pos_;  // step over the newline
      if (!value_.empty()) return;
    }
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::string& text_;
  size_t pos_ = 0;
  std::string value_;
  bool done_ = false;
};

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::byte_level() { return Tokenizer(); }

Tokenizer Tokenizer::load(const std::string& path) {
  Tokenizer t;
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    t.hf_ = HfTokenizer::load(path);
    return t;
  }
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  auto st = t.sp_->Load(path);
  if (!st.ok())
    throw Error(
        fmt::format("tokenizer {}: cannot load the SentencePiece model: {}", path, st.ToString()),
        "prepare the data again with loom data prepare");
  return t;
}

void Tokenizer::train_bpe(const std::string& text, int vocab_size, const std::string& model_prefix,
                          const std::string& what) {
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  // Every setting that keeps whitespace intact is spelled out; see the header's invariant.
  std::unordered_map<std::string, std::string> args{
      {"model_prefix", model_prefix},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_by_whitespace", "true"},
      {"split_digits", "false"},
      {"user_defined_symbols", "\n"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(1);  // the same text gives the same model
  LineIterator lines(text);
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines);
  if (!st.ok())
    throw Error(fmt::format("{}: SentencePiece could not train a BPE vocabulary of {}: {}", what,
                            vocab_size, st.ToString()),
                "a vocabulary must exceed 256 byte pieces plus the text's distinct characters and "
                "fit the text; try another --vocab-size, or 256 for byte-level tokens");
}

void Tokenizer::train_bpe(const std::vector<std::string>& text_files, int vocab_size,
                          const std::string& model_prefix) {
  std::string text;
  for (const auto& f : text_files) text += read_file(f);
  train_bpe(
      text, vocab_size, model_prefix,
      text_files.size() == 1 ? text_files[0] : fmt::format("{} text files", text_files.size()));
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  if (hf_) return hf_->encode(text);
  std::vector<int32_t> out;
  if (!sp_) {
    out.reserve(text.size());
    for (char c : text) out.push_back(int32_t(uint8_t(c)));
    return out;
  }
  // "\n" is a piece of its own, so no piece spans a newline and encoding newline-ended chunks
  // separately gives the same ids as encoding the whole text.
  std::vector<int> ids;
  for (size_t pos = 0; pos < text.size();) {
    size_t end =
        pos + kEncodeChunk >= text.size() ? text.size() : text.find('\n', pos + kEncodeChunk);
    end = end == std::string::npos ? text.size() : std::min(text.size(), end + 1);
    auto st = sp_->Encode(absl::string_view(text.data() + pos, end - pos), &ids);
    if (!st.ok()) throw Error(fmt::format("tokenizer: cannot encode: {}", st.ToString()));
    out.insert(out.end(), ids.begin(), ids.end());
    pos = end;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (hf_) return hf_->decode(ids);
  const int V = vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      throw Error(fmt::format("tokenizer: id {} is outside the vocabulary of {}", id, V));
  if (!sp_) return std::string(ids.begin(), ids.end());
  std::string s;
  auto st = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &s);
  if (!st.ok()) throw Error(fmt::format("tokenizer: cannot decode: {}", st.ToString()));
  return s;
}

int Tokenizer::vocab_size() const {
  return hf_ ? hf_->vocab_size() : sp_ ? sp_->GetPieceSize() : 256;
}

}  // namespace loom::data
