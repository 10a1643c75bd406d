// core/file.h's filesystem helpers: an answer or a loom::Error naming the path and the OS error,
// never std::filesystem's exception (a symlink loop, a directory under a regular file).
#include "loom/core/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/testing.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

TEST(FileHelpers, AnswerOrNameThePathAndTheOsError) {
  const fs::path dir = fs::temp_directory_path() / ("loom_file_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "plain") << "x";
  EXPECT_TRUE(path_exists((dir / "plain").string()));
  EXPECT_FALSE(path_exists((dir / "absent").string()));
  fs::create_symlink("nowhere", dir / "dangling");
  EXPECT_FALSE(path_exists((dir / "dangling").string()));
  // a symlink loop: stat fails with ELOOP, which is not "absent"
  fs::create_symlink("loop_b", dir / "loop_a");
  fs::create_symlink("loop_a", dir / "loop_b");
  std::string e = error_of([&] { path_exists((dir / "loop_a" / "x").string()); });
  EXPECT_NE(e.find("cannot stat"), std::string::npos) << e;
  EXPECT_NE(e.find("ELOOP"), std::string::npos) << e;
  // a directory under a regular file
  e = error_of([&] { make_directories((dir / "plain" / "sub").string()); });
  EXPECT_NE(e.find("cannot create directory"), std::string::npos) << e;
  EXPECT_NE(e.find("plain/sub"), std::string::npos) << e;
  make_directories((dir / "a" / "b").string());
  EXPECT_TRUE(fs::is_directory(dir / "a" / "b"));
  remove_tree((dir / "a").string());
  EXPECT_FALSE(fs::exists(dir / "a"));
  fs::remove_all(dir);
}

// A file written whole never replaces what is not a regular file (the rename would: a FIFO, a
// directory; as root a device), and an output that is one of the command's inputs is refused.
TEST(FileHelpers, AWholeFileNeverReplacesAFifoADirectoryOrAnInput) {
  const fs::path dir =
      fs::temp_directory_path() / ("loom_file_test2_" + std::to_string(::getpid()));
  fs::create_directories(dir / "a_dir");
  const std::string fifo = (dir / "fifo").string(), plain = (dir / "plain").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& p : {fifo, (dir / "a_dir").string()}) {
    std::string e = error_of([&] { write_file_atomic(p, "text"); });
    EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
    e = error_of([&] { check_output("--out", p); });
    EXPECT_NE(e.find("--out " + p + ": not a regular file"), std::string::npos) << e;
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_directory(dir / "a_dir"));
  write_file_atomic(plain, "weights");
  check_output("--out", plain, {{"--weights", (dir / "other").string()}});  // a new file: fine
  fs::create_symlink("plain", dir / "link");
  const std::string e = error_of([&] {
    check_output("--out", plain, {{"--weights", (dir / "link").string()}});
  });
  EXPECT_NE(e.find("is the file --weights reads"), std::string::npos) << e;
  EXPECT_EQ(read_file(plain), "weights");
  check_output("--out", (dir / "new").string());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
