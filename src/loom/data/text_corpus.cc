#include "loom/data/text_corpus.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::data {

namespace fs = std::filesystem;

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TextSplit split_text(const std::string& path, int val_every) {
  TextSplit s;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    // the error-code overloads throughout: an entry that cannot be read (a symlink loop, no
    // permission) is named, not thrown as a filesystem_error
    auto unreadable = [&](const std::string& what) {
      throw Error(fmt::format("data {}: cannot read {}: {}", path, what, ec.message()),
                  "remove or fix that entry, or point [data] path elsewhere");
    };
    fs::recursive_directory_iterator it(path, ec), end;
    if (ec) unreadable(path);
    while (it != end) {
      const std::string entry = it->path().string();
      const bool regular = it->is_regular_file(ec);
      if (ec) unreadable(entry);
      if (regular && it->path().extension() == ".txt") files.push_back(entry);
      it.increment(ec);
      if (ec) unreadable("the entry after " + entry);
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      // a `loom data prepare` directory with a file missing is not a folder of text
      std::string have, missing;
      for (const char* f : {"meta.json", "train.bin", "val.bin", "tokenizer.model"}) {
        const bool here = fs::exists(fs::path(path) / f, ec);
        std::string& list = here ? have : missing;
        if (here || std::string(f) != "tokenizer.model")
          list += (list.empty() ? "" : ", ") + std::string(f);
      }
      if (!have.empty() && !missing.empty())
        throw Error(fmt::format("data {}: a prepared data directory (it holds {}) without {}", path,
                                have, missing),
                    "prepare it again with loom data prepare, or restore the missing files");
      throw Error(fmt::format("data {}: no .txt files in the directory", path),
                  "point [data] path at a text file or a directory of .txt files");
    }
    for (size_t i = 0; i < files.size(); ++i) {
      std::string bytes = read_file(files[i]);
      bool val = files.size() >= 2 && (i % size_t(val_every) == size_t(val_every - 1) ||
                                       (i + 1 == files.size() && s.val_files.empty()));
      (val ? s.val : s.train) += bytes;
      (val ? s.val_files : s.train_files).push_back(files[i]);
    }
  } else if (fs::is_regular_file(path, ec)) {
    std::string bytes = read_file(path);
    if (bytes.rfind("LOOMTOK1", 0) == 0)  // would be trained on as the bytes of its ids
      throw Error(fmt::format("data {}: a token shard, not text", path),
                  "set [data] path to the directory loom data prepare wrote (it holds the shard, "
                  "its twin and meta.json)");
    size_t cut = bytes.size() - bytes.size() / 10;
    s.train = bytes.substr(0, cut);
    s.val = bytes.substr(cut);
    s.train_files = {path};
  } else if (const fs::file_status st = fs::status(path, ec);
             ec && ec != std::errc::no_such_file_or_directory) {
    throw Error(fmt::format("data {}: cannot read it: {}", path, ec.message()),  // a symlink loop
                "set [data] path to a text file or a directory of .txt files");
  } else if (fs::exists(st)) {
    // a FIFO, socket or device: named for what it is, not as missing (and never read: a FIFO
    // would block)
    throw Error(
        fmt::format("data {}: not a regular file or a directory (a FIFO, socket or device)", path),
        "set [data] path to a text file or a directory of .txt files");
  } else {
    throw Error(fmt::format("data {}: no such file or directory", path),
                "set [data] path to a text file or a directory of .txt files");
  }
  if (s.train.empty()) throw Error(fmt::format("data {}: the training text is empty", path));
  return s;
}

bool TextCorpus::is_prepared(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path + "/meta.json", ec) &&
         fs::exists(path + "/train.bin", ec) && fs::exists(path + "/val.bin", ec);
}

TextCorpus TextCorpus::open(const std::string& path, int64_t seq_len, int val_every) {
  TextCorpus c;
  if (is_prepared(path)) {
    c.meta_ = path + "/meta.json";
    const std::string hint = "prepare the directory again with loom data prepare";
    // every field read checked, the error naming it (a type_error named none)
    const nlohmann::json meta = read_json(c.meta_);
    auto bad = [&](const std::string& key, const std::string& want) {
      throw Error(fmt::format("{}: \"{}\" = {}: expected {}", c.meta_, key,
                              meta.contains(key) ? meta[key].dump() : "(absent)", want),
                  hint);
    };
    if (!meta.is_object() || meta.value("format", nlohmann::json()) != "loom-data")
      bad("format", "\"loom-data\" (loom data prepare's meta.json)");
    const nlohmann::json& vocab = meta.value("vocab_size", nlohmann::json());
    if (!vocab.is_number_integer() || vocab.get<int64_t>() < 1 ||
        vocab.get<int64_t>() > int64_t(INT32_MAX))
      bad("vocab_size", "a whole number in [1, 2^31-1]");
    c.vocab_ = vocab.get<int64_t>();
    const nlohmann::json& tok = meta.value("tokenizer", nlohmann::json("byte"));
    if (tok != "byte" && tok != "sentencepiece-bpe" && tok != "hf-bpe")
      bad("tokenizer", "\"byte\", \"sentencepiece-bpe\" or \"hf-bpe\"");
    if (tok != "byte") {  // ids a run cannot turn back into text without it
      const std::string file = tok == "hf-bpe" ? "tokenizer.json" : "tokenizer.model";
      if (meta.value("tokenizer_model", nlohmann::json()) != file)
        bad("tokenizer_model", "\"" + file + "\" for a " + tok.get<std::string>() + " tokenizer");
      if (!path_exists(path + "/" + file))
        throw Error(fmt::format("data {}: a prepared data directory whose {} tokenizer ({}) is "
                                "missing: its ids could not be made text again",
                                path, tok.get<std::string>(), file),
                    "prepare it again with loom data prepare, or restore the file");
    }
    const nlohmann::json& vf = meta.value("val_files", nlohmann::json::array());
    if (!vf.is_array() ||
        !std::all_of(vf.begin(), vf.end(), [](const auto& f) { return f.is_string(); }))
      bad("val_files", "an array of file names");
    c.val_files_ = vf.get<std::vector<std::string>>();
    c.train_.shard = Shard::open(path + "/train.bin");
    c.val_.shard = Shard::open(path + "/val.bin");
    c.train_.sharded = c.val_.sharded = true;
    for (const Shard* s : {&c.train_.shard, &c.val_.shard})
      if (s->vocab_size() != c.vocab_)
        throw Error(fmt::format("token shard {}: vocabulary {} does not match {}'s vocab_size {}",
                                s->path(), s->vocab_size(), c.meta_, c.vocab_),
                    hint);
    if (c.train_.size() == 0)
      throw Error(fmt::format("data {}: train.bin holds no tokens", path), hint);
  } else {
    TextSplit s = split_text(path, val_every);
    c.train_.bytes.assign(s.train.begin(), s.train.end());
    c.val_.bytes.assign(s.val.begin(), s.val.end());
    c.val_files_ = std::move(s.val_files);
  }
  struct Side {
    const char* name;
    int64_t size;
    bool val;
  };
  for (const Side& side :
       {Side{"training", c.train_.size(), false}, Side{"validation", c.val_.size(), true}})
    if (side.size < seq_len + 2)
      throw Error(
          fmt::format("data {}: {} {} {} are too few for sequences of {} tokens{}", path, side.size,
                      side.name, c.prepared() ? "tokens" : "bytes", seq_len,
                      c.prepared() || !side.val
                          ? ""
                          : fmt::format(" (the validation text: {})",
                                        c.val_files_.empty()
                                            ? "the file's last tenth"
                                            : fmt::format("{}", fmt::join(c.val_files_, ", ")))));
  return c;
}

void TextCorpus::sample(Split split, uint64_t seed, int64_t step, int rank, int64_t B, int64_t T,
                        int32_t* tokens) const {
  const Tokens& src = split == Split::train ? train_ : val_;
  const uint64_t span = uint64_t(src.size()) - uint64_t(T) - 1;
  for (int64_t r = 0; r < B; ++r) {
    uint64_t h = splitmix64(
        seed ^ splitmix64(uint64_t(step) ^ splitmix64(uint64_t(rank) * 1315423911u + uint64_t(r))));
    uint64_t off = h % (span + 1);
    src.read(int64_t(off), T + 1, tokens + r * (T + 1));
  }
}

}  // namespace loom::data
