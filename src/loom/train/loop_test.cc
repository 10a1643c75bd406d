// The training loop as a library call: a run, and the same run stopped after a checkpoint and
// resumed, log bit-identical metrics (loss, grad norm, val loss) at every step; bad runs are
// loom::Errors.
#include "loom/train/loop.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_loop_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

// Text of varied words, enough for train and validation samples of 33 bytes.
std::string text() {
  const char* words[] = {"the",    "loom",    "weaves", "a",     "thread", "of",
                         "tokens", "through", "every",  "layer", "and",    "gradient",
                         "moves",  "slowly",  "toward", "lower", "loss"};
  std::string s;
  uint32_t x = 12345;
  for (int i = 0; i < 6000; ++i) {
    x = x * 1664525u + 1013904223u;
    s += words[(x >> 16) % 17];
    s += (x >> 8) % 11 == 0 ? ".\n" : " ";
  }
  return s;
}

Config config(const TempDir& d) {
  write_file_atomic((d.path / "corpus.txt").string(), text());
  return load_config(
      std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml",
      {"data.path=" + (d.path / "corpus.txt").string(), "train.steps=6", "train.seq_len=32",
       "train.batch_size=2", "train.eval_every=3", "checkpoint.every=3", "checkpoint.keep=5"});
}

std::vector<nlohmann::json> metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> r;
  for (std::string line; std::getline(in, line);) r.push_back(nlohmann::json::parse(line));
  return r;
}

TEST(TrainLoop, ResumedRunLogsWhatAStraightRunDoes) {
  TempDir d;
  const Config cfg = config(d);
  RunOptions straight{.run_dir = (d.path / "straight").string()};
  train::Run a = open_run(cfg, straight);
  RunResult ra = train_rank(cfg, a, straight, nullptr);
  EXPECT_EQ(ra.start, 1);
  EXPECT_EQ(ra.last_step, 6);
  EXPECT_TRUE(std::isfinite(ra.last_val));

  // the same run, its step-6 checkpoint lost: resumed from step 3
  RunOptions resumed{.run_dir = (d.path / "resumed").string()};
  {
    train::Run b = open_run(cfg, resumed);  // holds the directory's lock while it lives
    train_rank(cfg, b, resumed, nullptr);
  }
  fs::remove_all(fs::path(resumed.run_dir) / "checkpoints" / "step_00000006");
  resumed.resume = true;
  train::Run b2 = open_run(cfg, resumed);
  ASSERT_TRUE(b2.latest.has_value());
  RunResult rb = train_rank(cfg, b2, resumed, nullptr);
  EXPECT_EQ(rb.start, 4);
  EXPECT_EQ(rb.loss, ra.loss);

  auto ma = metrics(a.metrics), mb = metrics(b2.metrics);
  ASSERT_EQ(ma.size(), 6u);
  ASSERT_EQ(mb.size(), 6u);
  for (size_t i = 0; i < ma.size(); ++i)
    for (const char* key : {"step", "loss", "grad_norm", "lr"})
      EXPECT_EQ(ma[i][key], mb[i][key]) << "step " << i + 1 << " " << key;
  EXPECT_EQ(ma[5]["val_loss"], mb[5]["val_loss"]);
}

TEST(TrainLoop, BadRunsAreErrors) {
  TempDir d;
  Config cfg = config(d);
  RunOptions opts{.run_dir = (d.path / "run").string()};
  {
    train::Run r = open_run(cfg, opts);
    train_rank(cfg, r, opts, nullptr);
  }
  // checkpoints there and no resume
  try {
    open_run(cfg, opts);
    ADD_FAILURE() << "a run dir with checkpoints opened without --resume";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already holds checkpoints"), std::string::npos)
        << e.what();
  }
  Config no_data = cfg;
  no_data.data.path.clear();
  EXPECT_THROW(open_run(no_data, {.run_dir = (d.path / "other").string()}), Error);
  Config small = cfg;
  small.model.vocab_size = 100;
  EXPECT_THROW(open_run(small, {.run_dir = (d.path / "small").string()}), Error);
}

// What a run directory holds is never lost to a second run: the lock comes before any look inside
// (a second open_run while the first holds it stops at once), a fresh run refuses a directory whose
// metrics.jsonl no checkpoint continues, and a lock file that is a symbolic link is refused.
TEST(TrainLoop, ARunDirectoryIsLockedFirstAndItsLogIsKept) {
  TempDir d;
  const Config cfg = config(d);
  RunOptions opts{.run_dir = (d.path / "run").string()};
  auto message = [&](const RunOptions& o) {
    try {
      open_run(cfg, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  {
    train::Run r = open_run(cfg, opts);
    EXPECT_NE(message(opts).find("is in use"), std::string::npos) << message(opts);
  }
  // a run that logged steps and died before its first checkpoint
  const std::string log = "{\"step\":1,\"loss\":5.5}\n";
  write_file_atomic(opts.run_dir + "/metrics.jsonl", log);
  EXPECT_NE(message(opts).find("holds an earlier run's metrics.jsonl but no checkpoint"),
            std::string::npos)
      << message(opts);
  EXPECT_EQ(read_file(opts.run_dir + "/metrics.jsonl"), log);  // untouched
  // a symbolic link where the lock file goes
  const fs::path linked = d.path / "linked";
  fs::create_directories(linked);
  fs::create_symlink(d.path / "elsewhere", linked / ".lock");
  const std::string why = message({.run_dir = linked.string()});
  EXPECT_NE(why.find("is a symbolic link"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(d.path / "elsewhere"));
}

}  // namespace
}  // namespace loom::train
