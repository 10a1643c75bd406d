#include "loom/tokenizer/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::data {

namespace {

// GPT-2's pre-tokenizer pattern, as the tokenizers library's ByteLevel uses it.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlongs, no surrogates, at
// most U+10FFFF), or 0 when the bytes there are not one.
size_t valid_utf8_at(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t left = s.size() - i;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // beyond U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

struct HfTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  const nlohmann::json j = read_json(path);
  if (!j.is_object()) throw Error(fmt::format("tokenizer {}: expected a JSON object", path));
  // An error naming `field` of `obj` (spelled `where` + field) and its value.
  auto fail = [&](const nlohmann::json& obj, const char* where, const std::string& field,
                  const std::string& why) {
    std::string shown = obj.contains(field) ? obj[field].dump() : "(absent)";
    if (shown.size() > 100) shown = shown.substr(0, 97) + "...";
    throw Error(fmt::format("tokenizer {}: {}{} = {}: {}", path, where, field, shown, why),
                "Loom reads byte-level BPE tokenizer.json files (GPT-2's and Llama 3's layouts)");
  };
  auto bad = [&](const std::string& field, const std::string& why) { fail(j, "", field, why); };
  // present with a value: not absent, null or ""
  auto set = [](const nlohmann::json& obj, const char* key) {
    return obj.contains(key) && !obj[key].is_null() && obj[key] != "";
  };
  // obj[key] where present and not null, else `fallback`; a value of another type is an error
  // naming the field (never nlohmann's type_error)
  auto text_at = [&](const nlohmann::json& obj, const char* where, const char* key,
                     const char* fallback) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return std::string(fallback);
    if (!obj[key].is_string()) fail(obj, where, key, "expected a string");
    return obj[key].get<std::string>();
  };
  auto flag_at = [&](const nlohmann::json& obj, const char* where, const char* key, bool fallback) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_boolean()) fail(obj, where, key, "expected true or false");
    return obj[key].get<bool>();
  };
  auto t = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  t->path_ = path;

  if (set(j, "normalizer")) bad("normalizer", "Loom applies no normalizer");
  // The pre-tokenizer is one regex that cuts text into words: GPT-2's for ByteLevel with use_regex;
  // for Sequence[Split(Regex, Isolated), ByteLevel without regex] (Llama 3, Qwen 2), the Split's.
  const auto& pre = j.value("pre_tokenizer", nlohmann::json());
  const char* kPreWhy =
      "Loom reads ByteLevel (use_regex, no prefix space), or a Sequence of Split (a Regex "
      "pattern, behavior Isolated, not inverted) and ByteLevel (no regex, no prefix space)";
  auto byte_level = [&](const nlohmann::json& p, const char* where, bool use_regex) {
    return p.is_object() && text_at(p, where, "type", "") == "ByteLevel" &&
           flag_at(p, where, "use_regex", true) == use_regex &&
           !flag_at(p, where, "add_prefix_space", false);
  };
  std::string pattern;
  if (byte_level(pre, "pre_tokenizer.", true)) {
    pattern = kGpt2Pattern;
  } else if (pre.is_object() && text_at(pre, "pre_tokenizer.", "type", "") == "Sequence" &&
             pre.value("pretokenizers", nlohmann::json()).is_array() &&
             pre["pretokenizers"].size() == 2 &&
             byte_level(pre["pretokenizers"][1], "pre_tokenizer.pretokenizers[1].", false)) {
    const auto& split = pre["pretokenizers"][0];
    const char* where = "pre_tokenizer.pretokenizers[0].";
    if (!split.is_object() || text_at(split, where, "type", "") != "Split" ||
        text_at(split, where, "behavior", "") != "Isolated" ||
        flag_at(split, where, "invert", false) ||
        !split.value("pattern", nlohmann::json()).is_object() ||
        !split["pattern"].value("Regex", nlohmann::json()).is_string())
      bad("pre_tokenizer", kPreWhy);
    pattern = split["pattern"]["Regex"].get<std::string>();
  } else {
    bad("pre_tokenizer", kPreWhy);
  }
  const auto& dec = j.value("decoder", nlohmann::json());
  if (!dec.is_object() || text_at(dec, "decoder.", "type", "") != "ByteLevel")
    bad("decoder", "Loom decodes ByteLevel only");
  if (!j.contains("model") || !j["model"].is_object()) bad("model", "expected an object");
  const auto& m = j["model"];
  auto bad_model = [&](const std::string& field, const std::string& why) {
    fail(m, "model.", field, why);
  };
  if (text_at(m, "model.", "type", "") != "BPE") bad_model("type", "Loom reads BPE models only");
  if (set(m, "dropout")) bad_model("dropout", "no BPE dropout");
  if (set(m, "unk_token")) bad_model("unk_token", "byte-level BPE needs no unknown token");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (set(m, affix)) bad_model(affix, "none expected");
  if (flag_at(m, "model.", "byte_fallback", false))
    bad_model("byte_fallback", "byte-level BPE has no fallback");
  // a word in the vocabulary is one token
  t->ignore_merges_ = flag_at(m, "model.", "ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) bad_model("vocab", "expected an object");
  if (!m.contains("merges") || !m["merges"].is_array()) bad_model("merges", "expected an array");

  int32_t max_id = -1;
  auto take_id = [&](const nlohmann::json& v, const std::string& what) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("tokenizer {}: {}: id {} is not a non-negative integer", path, what,
                              v.dump()));
    int32_t id = int32_t(v.get<int64_t>());
    max_id = std::max(max_id, id);
    return id;
  };
  std::map<int32_t, std::string> piece_of;  // one piece an id
  for (const auto& [piece, id] : m["vocab"].items()) {
    const int32_t i = take_id(id, "model.vocab[\"" + piece + "\"]");
    if (const auto [it, fresh] = piece_of.emplace(i, piece); !fresh)
      throw Error(fmt::format("tokenizer {}: model.vocab gives id {} to both '{}' and '{}'", path,
                              i, it->second, piece));
    t->vocab_[piece] = i;
  }
  int32_t rank = 0;
  for (const auto& mg : m["merges"]) {
    std::string a, b;
    const std::string s = mg.is_string() ? mg.get<std::string>() : "";
    if (const size_t sp = s.find(' '); mg.is_string() && sp != std::string::npos) {
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    }
    if (a.empty() || b.empty())
      throw Error(
          fmt::format("tokenizer {}: model.merges[{}] = {}: expected [\"a\", \"b\"] or "
                      "\"a b\"",
                      path, rank, mg.dump()));
    // as the tokenizers library requires: both pieces and what they make are in the vocabulary
    for (const std::string& p : {a, b, a + b})
      if (!t->vocab_.count(p))
        throw Error(fmt::format("tokenizer {}: model.merges[{}] = {}: '{}' is not in model.vocab",
                                path, rank, mg.dump(), p));
    t->merge_rank_.emplace(a + " " + b, rank++);  // a repeated merge keeps its first (best) rank
  }
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) bad("added_tokens", "expected an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
          !a.contains("id"))
        throw Error(
            fmt::format("tokenizer {}: added_tokens: {} lacks content or id", path, a.dump()));
      const std::string content = a["content"].get<std::string>();
      if (content.empty()) throw Error(fmt::format("tokenizer {}: an empty added token", path));
      t->added_.push_back({content, take_id(a["id"], "added_tokens \"" + content + "\"")});
    }
    std::stable_sort(t->added_.begin(), t->added_.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  // ids index tables sized by the largest: they must be the entries' (dense, as every released
  // tokenizer's are), not any number up to 2^31 - 1
  const int64_t entries = int64_t(t->vocab_.size() + t->added_.size());
  if (int64_t(max_id) >= entries)
    throw Error(
        fmt::format("tokenizer {}: id {} is beyond the {} entries of model.vocab and "
                    "added_tokens (ids are 0 to entries - 1)",
                    path, max_id, entries));
  t->vocab_size_ = max_id + 1;
  t->pieces_.assign(size_t(t->vocab_size_), "");
  t->is_added_.assign(size_t(t->vocab_size_), 0);
  for (const auto& [piece, id] : t->vocab_) t->pieces_[size_t(id)] = piece;
  for (const auto& [content, id] : t->added_) {
    t->pieces_[size_t(id)] = content;
    t->is_added_[size_t(id)] = 1;
  }

  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others take
  // code points from 256 up, in byte order.
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t->byte_char_[b] = utf8(printable ? uint32_t(b) : next++);
    t->char_byte_[t->byte_char_[b]] = uint8_t(b);
  }

  t->regex_ = std::make_unique<Regex>();
  int err = 0;
  PCRE2_SIZE off = 0;
  t->regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!t->regex_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(
        fmt::format("tokenizer {}: pre_tokenizer: the pattern does not compile at offset "
                    "{}: {}",
                    path, off, reinterpret_cast<const char*>(msg)));
  }
  return t;
}

void HfTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  std::vector<std::string> sym;
  for (unsigned char b : word) sym.push_back(byte_char_[b]);
  if (ignore_merges_) {
    std::string whole;
    for (const auto& s : sym) whole += s;
    if (auto it = vocab_.find(whole); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  while (sym.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
      if (it != merge_rank_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    // merge every occurrence of the best pair, left to right (as tokenizers does)
    const std::string a = sym[at], b = sym[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
        merged.push_back(a + b);
        i += 2;
      } else {
        merged.push_back(sym[i++]);
      }
    }
    sym = std::move(merged);
  }
  for (const auto& s : sym) {
    auto it = vocab_.find(s);
    if (it == vocab_.end())
      throw Error(fmt::format("tokenizer {}: the piece '{}' of the word '{}' is not in the "
                              "vocabulary",
                              path_, s, word),
                  "a byte-level vocabulary must hold every single-byte piece");
    out.push_back(it->second);
  }
}

void HfTokenizer::encode_span(const std::string& text, std::vector<int32_t>& out) const {
  // Byte-level BPE is lossless for any bytes: a byte that is not part of well-formed UTF-8 (a
  // Latin-1 letter in an old text) is a word of its own; the runs between go through the regex.
  size_t run = 0, i = 0;
  while (i < text.size()) {
    const size_t n = valid_utf8_at(text, i);
    if (n) {
      i += n;
      continue;
    }
    if (i > run) encode_utf8(text.substr(run, i - run), out);
    encode_word(text.substr(i, 1), out);
    run = ++i;
  }
  if (run < text.size()) encode_utf8(run == 0 ? text : text.substr(run), out);
}

void HfTokenizer::encode_utf8(const std::string& text, std::vector<int32_t>& out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {  // encode_span checked the text is well-formed UTF-8
    int rc = pcre2_match(regex_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // the last alternatives match any whitespace; rare
    if (rc < 0) {
      pcre2_match_data_free(md);
      throw Error(fmt::format("tokenizer {}: PCRE2 error {} at byte {}", path_, rc, pos));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > pos) encode_word(text.substr(pos, ov[0] - pos), out);  // unmatched: as one word
    if (ov[1] == ov[0]) {                           // an empty match: step one character
      const size_t n = valid_utf8_at(text, ov[0]);  // the text is well-formed: n >= 1
      encode_word(text.substr(ov[0], n), out);
      pos = ov[0] + n;
      continue;
    }
    encode_word(text.substr(ov[0], ov[1] - ov[0]), out);
    pos = ov[1];
  }
  if (pos < text.size()) encode_word(text.substr(pos), out);
  pcre2_match_data_free(md);
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& a : added_)  // longest first
      if (text.compare(pos, a.first.size(), a.first) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++pos;
      continue;
    }
    if (pos > start) encode_span(text.substr(start, pos - start), out);
    out.push_back(hit->second);
    pos += hit->first.size();
    start = pos;
  }
  if (start < text.size()) encode_span(text.substr(start), out);
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || (pieces_[size_t(id)].empty() && !is_added_[size_t(id)]))
      throw Error(fmt::format("tokenizer {}: id {} is not in the vocabulary (size {})", path_, id,
                              vocab_size_));
    const std::string& p = pieces_[size_t(id)];
    if (is_added_[size_t(id)]) {
      out += p;
      continue;
    }
    for (size_t i = 0; i < p.size();) {
      const size_t n = std::max<size_t>(1, valid_utf8_at(p, i));
      auto it = char_byte_.find(p.substr(i, n));
      if (it == char_byte_.end())
        throw Error(
            fmt::format("tokenizer {}: piece '{}' (id {}) is not byte-level", path_, p, id));
      out += char(it->second);
      i += n;
    }
  }
  return out;
}

}  // namespace loom::data
