// Text corpora (text_corpus.h): what a [data] path that is not text is called. A prepared
// directory with a file missing is named as one (not "no .txt files"), and a FIFO as what it is
// (not "no such file", and never read: reading would block).
#include "loom/data/text_corpus.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::string& path) {
  try {
    split_text(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TextCorpus, PathsThatAreNotTextAreNamedForWhatTheyAre) {
  const fs::path dir =
      fs::temp_directory_path() / ("loom_corpus_test_" + std::to_string(::getpid()));
  fs::create_directories(dir / "prepared");
  std::ofstream(dir / "prepared" / "meta.json") << "{}";
  std::ofstream(dir / "prepared" / "train.bin") << "x";
  std::string e = error_of((dir / "prepared").string());
  EXPECT_NE(e.find("a prepared data directory (it holds meta.json, train.bin) without val.bin"),
            std::string::npos)
      << e;
  fs::create_directories(dir / "empty");
  e = error_of((dir / "empty").string());
  EXPECT_NE(e.find("no .txt files in the directory"), std::string::npos) << e;
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  e = error_of((dir / "fifo").string());
  EXPECT_NE(e.find("not a regular file or a directory"), std::string::npos) << e;
  e = error_of((dir / "absent").string());
  EXPECT_NE(e.find("no such file or directory"), std::string::npos) << e;
  // a directory of text with a symlink loop in it: the loop is named, never a filesystem_error
  fs::create_directories(dir / "texts" / "sub");
  std::ofstream(dir / "texts" / "a.txt") << "some text\n";
  fs::create_directory_symlink("loop_b", dir / "texts" / "sub" / "loop_a");
  fs::create_directory_symlink("loop_a", dir / "texts" / "sub" / "loop_b");
  e = error_of((dir / "texts").string());
  EXPECT_NE(e.find("loop_"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot read"), std::string::npos) << e;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::data
