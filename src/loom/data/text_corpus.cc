#include "loom/data/text_corpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "loom/core/error.h"

namespace loom::data {

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("data {}: cannot read", path));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TextCorpus TextCorpus::open(const std::string& path, int64_t seq_len, int val_every) {
  TextCorpus c;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw Error(fmt::format("data {}: no .txt files in the directory", path),
                  "point [data] path at a text file or a directory of .txt files");
    for (size_t i = 0; i < files.size(); ++i) {
      auto bytes = read_all(files[i]);
      bool val = files.size() >= 2 && (i % size_t(val_every) == size_t(val_every - 1) ||
                                       (i + 1 == files.size() && c.val_files_.empty()));
      auto& dst = val ? c.val_ : c.train_;
      dst.insert(dst.end(), bytes.begin(), bytes.end());
      if (val) c.val_files_.push_back(files[i]);
    }
  } else if (fs::is_regular_file(path, ec)) {
    auto bytes = read_all(path);
    size_t cut = bytes.size() - bytes.size() / 10;
    c.train_.assign(bytes.begin(), bytes.begin() + long(cut));
    c.val_.assign(bytes.begin() + long(cut), bytes.end());
  } else {
    throw Error(fmt::format("data {}: no such file or directory", path),
                "set [data] path to a text file or a directory of .txt files");
  }
  if (c.train_.empty()) throw Error(fmt::format("data {}: the training text is empty", path));
  if (int64_t(c.train_.size()) < seq_len + 2 || int64_t(c.val_.size()) < seq_len + 2)
    throw Error(fmt::format("data {}: {} training and {} validation bytes are too few for "
                            "sequences of {} tokens",
                            path, c.train_.size(), c.val_.size(), seq_len));
  return c;
}

void TextCorpus::sample(Split split, uint64_t seed, int64_t step, int rank, int64_t B, int64_t T,
                        int32_t* tokens) const {
  const std::vector<uint8_t>& src = split == Split::train ? train_ : val_;
  const uint64_t span = uint64_t(src.size()) - uint64_t(T) - 1;
  for (int64_t r = 0; r < B; ++r) {
    uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(step) ^ splitmix64(uint64_t(rank) * 1315423911u +
                                                                          uint64_t(r))));
    uint64_t off = h % (span + 1);
    for (int64_t t = 0; t <= T; ++t) tokens[r * (T + 1) + t] = src[off + uint64_t(t)];
  }
}

}  // namespace loom::data
