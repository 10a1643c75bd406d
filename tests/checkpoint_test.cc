// Checkpoints: resume is bit-exact (f32 and bf16), old checkpoints are pruned, crashed writers'
// temp directories are never taken for checkpoints, and a corrupt checkpoint is a clear error.
#include "loom/train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/train/checkpoint_writer.h"
#include "loom/train/schedule.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> batch(const Config& c, int64_t step) {
  std::mt19937 rng(uint32_t(1000003 * step + 17));
  std::uniform_int_distribution<int32_t> u(0, int32_t(c.model.vocab_size - 1));
  std::vector<int32_t> t(size_t(c.train.batch_size * (c.train.seq_len + 1)));
  for (auto& x : t) x = u(rng);
  return t;
}

std::string temp_dir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("loom_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, IsBitExact) {
  Config cfg = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml",
                           {"model.dtype=" + GetParam()});
  Schedule sched{.lr = 3e-3, .min_lr = 3e-4, .warmup = 2, .total = 8};
  const std::string dir = temp_dir("resume_" + GetParam());

  std::vector<float> straight;
  std::string at3;
  {
    ParamStore p(cfg.model);
    p.init_random(7);
    StepRunner r(cfg, p, StepRunner::Mode::train);
    for (int64_t s = 1; s <= 8; ++s) {
      straight.push_back(r.step(batch(cfg, s).data(), sched.at(s)));
      if (s == 3) at3 = save_checkpoint(dir, p, r, {{"note", "test"}}, "# config\n", 0);
    }
  }
  ParamStore p(cfg.model);  // different init: everything must come from the checkpoint
  p.init_random(99);
  StepRunner r(cfg, p, StepRunner::Mode::train);
  auto st = load_checkpoint(at3, p, r);
  EXPECT_EQ(st["step"], 3);
  EXPECT_EQ(st["note"], "test");
  for (int64_t s = 4; s <= 8; ++s) {
    float loss = r.step(batch(cfg, s).data(), sched.at(s));
    EXPECT_EQ(loss, straight[size_t(s - 1)]) << "step " << s << " differs after resume";
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Resume, ::testing::Values("f32", "bf16"));

TEST(Checkpoint, KeepsTheNewestAndIgnoresTempDirectories) {
  Config cfg = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-gpt2.toml");
  const std::string dir = temp_dir("keep");
  ParamStore p(cfg.model);
  p.init_random(1);
  StepRunner r(cfg, p, StepRunner::Mode::train);
  fs::create_directories(dir + "/.tmp.step_00000099.12345");  // a crashed writer's leftovers
  std::ofstream(dir + "/.tmp.step_00000099.12345/model.safetensors") << "half";
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);
  for (int s = 1; s <= 4; ++s) {
    r.step(batch(cfg, s).data());
    save_checkpoint(dir, p, r, {}, "", /*keep=*/2);
  }
  auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step_00000003");
  EXPECT_EQ(fs::path(*latest_checkpoint(dir)).filename(), "step_00000004");
  EXPECT_FALSE(fs::exists(dir + "/.tmp.step_00000099.12345")) << "temp directories are swept";
  fs::remove_all(dir);
}

// [checkpoint] async (checkpoint_writer.h): a write held back while the run trains two more steps
// (its parameters and moments change) writes, byte for byte, the files of a synchronous save at
// the step it was taken at, and nothing is in place before it is committed. A write that fails
// (its temporary directory taken away) fails the commit naming the checkpoint, leaving nothing
// behind and the earlier checkpoint as it was; one still under way when its writer goes (a run
// stopping on an error) is committed.
TEST(Checkpoint, AnAsyncSaveWritesTheStepItWasTakenAt) {
  Config cfg = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml");
  const std::string sync_dir = temp_dir("sync"), dir = temp_dir("async");
  ParamStore p(cfg.model);
  p.init_random(3);
  StepRunner r(cfg, p, StepRunner::Mode::train);
  for (int s = 1; s <= 3; ++s) r.step(batch(cfg, s).data(), 1e-3);
  const nlohmann::json state = {{"data", "somewhere"}};
  const std::string want = save_checkpoint(sync_dir, p, r, state, "# config\n", 0);
  std::promise<void> trained;
  std::shared_future<void> go = trained.get_future().share();
  std::string got;
  {
    CheckpointWriter w(dir, 0, /*async=*/true);
    w.hold_writes([go] { go.wait(); });
    EXPECT_EQ(w.save(p, r, state, "# config\n"), "");
    EXPECT_EQ(w.pending_step(), 3);
    for (int s = 4; s <= 5; ++s) r.step(batch(cfg, s).data(), 1e-3);
    EXPECT_EQ(w.poll(), "") << "held back: nothing is written yet";
    EXPECT_TRUE(list_checkpoints(dir).empty());
    trained.set_value();
    got = w.finish();
    EXPECT_EQ(w.pending_step(), -1);
    EXPECT_EQ(w.last().step, 3);
    int64_t floats = 0;
    for (const auto& info : p.infos()) floats += numel(info.shape);
    EXPECT_GT(w.last().bytes, 3 * 4 * floats) << "the parameters and both moments, f32";
  }
  ASSERT_EQ(fs::path(got).filename(), "step_00000003");
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "state.json", "config.toml"})
    EXPECT_EQ(read_file(got + "/" + file), read_file(want + "/" + file)) << file;
  {
    CheckpointWriter w(dir, 0, true);
    w.hold_writes([&] {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().rfind(".tmp.", 0) == 0) fs::remove_all(e.path());
    });
    w.save(p, r, state, "");
    std::string error;
    try {
      w.finish();
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("cannot write checkpoint " + dir + "/step_00000005"), std::string::npos)
        << error;
  }
  EXPECT_EQ(list_checkpoints(dir), std::vector<std::string>{got});
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "step_00000003") << "left behind";
  EXPECT_EQ(read_file(got + "/model.safetensors"), read_file(want + "/model.safetensors"));
  {
    CheckpointWriter w(dir, 0, true);
    r.step(batch(cfg, 6).data(), 1e-3);
    w.save(p, r, state, "");
  }
  EXPECT_EQ(fs::path(latest_checkpoint(dir).value_or("")).filename(), "step_00000006");
  fs::remove_all(sync_dir);
  fs::remove_all(dir);
}

// A resume that passed over a damaged newer checkpoint (step 9 here) trains on from an older one:
// the sweep neither counts the later step (keep = 1 would otherwise keep only it and delete every
// good checkpoint, the one just written included) nor deletes it; and one the run reaches again
// (step 3 here) is kept beside the new one as step_00000003.damaged, not replaced.
TEST(Checkpoint, TheSweepNeverCountsALaterDamagedCheckpoint) {
  Config cfg = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml");
  const std::string dir = temp_dir("sweep");
  ParamStore p(cfg.model);
  p.init_random(1);
  StepRunner r(cfg, p, StepRunner::Mode::train);
  fs::create_directories(dir + "/step_00000009");  // damaged: no files a load would accept
  fs::create_directories(dir + "/step_00000003");
  std::ofstream(dir + "/step_00000003/model.safetensors") << "damaged";
  std::string last;
  for (int s = 1; s <= 3; ++s) {
    r.step(batch(cfg, s).data());
    last = save_checkpoint(dir, p, r, {}, "", /*keep=*/1);
  }
  auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], last) << "the checkpoint just written stays";
  EXPECT_EQ(fs::path(all[0]).filename(), "step_00000003");
  EXPECT_EQ(fs::path(all[1]).filename(), "step_00000009") << "the later one is not deleted";
  std::ifstream kept(dir + "/step_00000003.damaged/model.safetensors");
  std::string text;
  kept >> text;
  EXPECT_EQ(text, "damaged") << "the damaged step 3 is kept aside";
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptFilesAreClearErrors) {
  Config cfg = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml");
  const std::string dir = temp_dir("corrupt");
  ParamStore p(cfg.model);
  p.init_random(1);
  StepRunner r(cfg, p, StepRunner::Mode::train);
  r.step(batch(cfg, 1).data());
  std::string ck = save_checkpoint(dir, p, r, {}, "", 0);
  auto expect_error = [&](const std::string& file) {
    try {
      load_checkpoint(ck, p, r);
      ADD_FAILURE() << "no error for corrupt " << file;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    }
  };
  fs::resize_file(ck + "/optimizer.safetensors", fs::file_size(ck + "/optimizer.safetensors") - 8);
  expect_error("optimizer.safetensors");
  fs::resize_file(ck + "/model.safetensors", 100);
  expect_error("model.safetensors");
  std::ofstream(ck + "/state.json") << "{\"step\": ";
  expect_error("state.json");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::train

namespace loom::train {
namespace {

// Gradient accumulation: 2 micro-batches of 2 rows follow the same trajectory as one batch of 4
// (equal up to float summation order), and resume through a checkpoint stays bit-exact.
TEST(GradAccum, MatchesTheFullBatchAndResumesExactly) {
  const std::string cfg_path = std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml";
  Config full = load_config(cfg_path, {"train.batch_size=4"});
  Config accum = load_config(cfg_path, {"train.batch_size=2", "train.grad_accum=2"});
  auto rows = [&](int64_t step) {  // 4 rows of T+1 tokens
    std::mt19937 rng(uint32_t(step) * 7919u);
    std::uniform_int_distribution<int32_t> u(0, 255);
    std::vector<int32_t> t(size_t(4 * (full.train.seq_len + 1)));
    for (auto& x : t) x = u(rng);
    return t;
  };
  ParamStore pf(full.model), pa(accum.model);
  pf.init_random(3);
  pa.init_random(3);
  StepRunner rf(full, pf, StepRunner::Mode::train), ra(accum, pa, StepRunner::Mode::train);
  ASSERT_EQ(ra.rows_per_step(), 4);
  std::vector<float> accum_losses;
  const std::string dir = temp_dir("accum");
  std::string at2;
  for (int64_t s = 1; s <= 4; ++s) {
    float a = rf.step(rows(s).data(), 2e-3), b = ra.step(rows(s).data(), 2e-3);
    accum_losses.push_back(b);
    EXPECT_NEAR(a, b, 2e-5 * std::abs(a)) << "step " << s;
    EXPECT_NEAR(rf.grad_norm(), ra.grad_norm(), 1e-4 * rf.grad_norm()) << "step " << s;
    if (s == 2) at2 = save_checkpoint(dir, pa, ra, {}, "", 0);
  }
  ParamStore p2(accum.model);
  StepRunner r2(accum, p2, StepRunner::Mode::train);
  load_checkpoint(at2, p2, r2);
  for (int64_t s = 3; s <= 4; ++s)
    EXPECT_EQ(r2.step(rows(s).data(), 2e-3), accum_losses[size_t(s - 1)]) << "resumed step " << s;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::train
