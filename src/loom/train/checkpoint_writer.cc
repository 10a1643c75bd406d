#include "loom/train/checkpoint_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/checksum.h"
#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/train/checkpoint.h"
#include "loom/train/sharded_checkpoint.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// state.json's text: the caller's state, the format, the step and the checksums.
std::string state_text(const nlohmann::json& state, int64_t step, const std::string& config_text) {
  nlohmann::json st = state;
  st["format"] = 1;
  st["step"] = step;
  st["config_crc32"] = crc32_hex(config_text);
  st["crc32"] = crc32_hex(st.dump());  // of the rest, as dump() writes it (keys sorted)
  return st.dump(2) + "\n";
}

// A checkpoint of the step about to be saved is one a resume passed over as damaged (resuming takes
// the newest that loads): it is kept, renamed STEP.damaged (.damaged.2, ...: no checkpoint name),
// never replaced, so that it can still be inspected or restored.
void set_aside(const std::string& final_path) {
  if (!path_exists(final_path)) return;
  std::string aside = final_path + ".damaged";
  for (int i = 2; path_exists(aside); ++i) aside = fmt::format("{}.damaged.{}", final_path, i);
  if (::rename(final_path.c_str(), aside.c_str()) != 0)
    throw_os("set aside the damaged checkpoint", final_path, errno);
  fmt::print(stderr, "checkpoint {}: kept as {} (a resume passed over it as damaged)\n", final_path,
             aside);
}

// Sweep: of the checkpoints up to `step`, those older than the newest `keep` (the one just written
// the newest of them); a later step's checkpoint is one a resume passed over as damaged: never
// counted (it would push good ones out), never deleted. Then temp directories of crashed writers.
void sweep(const std::string& dir, int64_t step, int64_t keep) {
  std::error_code ec;
  std::vector<std::string> upto;
  for (const std::string& c : list_checkpoints(dir))
    if (checkpoint_step(fs::path(c).filename().string()) <= step) upto.push_back(c);
  if (keep > 0 && int64_t(upto.size()) > keep)
    for (size_t i = 0; i < upto.size() - size_t(keep); ++i) fs::remove_all(upto[i], ec);
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".tmp.", 0) == 0) fs::remove_all(e.path(), ec);
}

// `dir` (made if missing) and in it the empty temporary directory `tmp` (a crashed writer's
// leftover of the same name removed); a loom::Error naming what cannot be made.
void make_temp_dir(const std::string& dir, const std::string& tmp) {
  make_directories(dir);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw Error(fmt::format("cannot create {}: {}", tmp, ec.message()));
}

// The message of whatever `f` throws ("" if nothing).
std::string failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return *e.what() ? e.what() : "unknown error";
  } catch (...) {
    return "unknown error";
  }
  return "";
}

}  // namespace

// One checkpoint from begin to commit.
struct CheckpointWriter::Job {
  int64_t step = 0;
  std::string final_path, tmp;
  comm::Communicator* world = nullptr;  // a sharded run's ranks, which agree at each phase
  int rank = 0;
  std::vector<std::vector<float>> owned;  // the snapshot (async), an unsharded save's moments
  std::vector<std::pair<std::string, std::vector<TensorToWrite>>> tensors;  // file, its tensors
  std::vector<std::pair<std::string, std::string>> texts;                   // file, its text
  std::function<void()> hold;  // tests: runs on the writing thread before it writes
  std::thread thread;
  std::atomic<bool> done{false};
  std::string error;  // the write's failure, read once done
  double blocked_s = 0, write_s = 0;
  int64_t bytes = 0;

  // The write phase: every file into `tmp`, fsynced (write_safetensors, write_file_atomic).
  void write() {
    const auto t0 = Clock::now();
    if (hold) hold();
    error = failure_of([&] {
      for (const auto& [file, ts] : tensors) {
        write_safetensors(tmp + "/" + file, ts);
        for (const TensorToWrite& t : ts) bytes += numel(t.shape) * dtype_size(t.dtype);
      }
      for (const auto& [file, text] : texts) {
        write_file_atomic(tmp + "/" + file, text);
        bytes += int64_t(text.size());
      }
    });
    write_s = seconds_since(t0);
    done.store(true, std::memory_order_release);
  }

  // Under a plan: every rank's `mine` ("" or its failure) gathered; a failure anywhere removes the
  // temporary directory (rank 0) and throws on every rank, naming the rank that failed.
  void agree(const std::string& mine) const {
    const int ranks = world->size();
    int32_t bad = mine.empty() ? 0 : 1;
    std::vector<int32_t> all(size_t(ranks), 0);
    world->all_gather(&bad, all.data(), 4);
    for (int r = 0; r < ranks; ++r) {
      if (!all[size_t(r)]) continue;
      std::error_code ec;
      if (rank == 0) fs::remove_all(tmp, ec);
      throw Error(r == rank ? fmt::format("cannot write checkpoint {}: {}", final_path, mine)
                            : fmt::format("cannot write checkpoint {}: rank {} failed (its own "
                                          "error says why)",
                                          final_path, r));
    }
  }
};

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep, bool async, bool writer)
    : dir_(std::move(dir)), keep_(keep), async_(async), writer_(writer) {}

CheckpointWriter::~CheckpointWriter() {
  if (!job_) return;
  if (job_->thread.joinable()) job_->thread.join();
  if (job_->world) {
    if (job_->rank == 0)
      fmt::print(stderr,
                 "checkpoint {}: not committed (the run stopped while it was written); {} is "
                 "swept by the next save\n",
                 job_->final_path, job_->tmp);
    return;
  }
  const std::string failed = failure_of([&] { commit(true); });
  if (!failed.empty()) fmt::print(stderr, "{}\n", failed);
}

int64_t CheckpointWriter::pending_step() const { return job_ ? job_->step : -1; }

void CheckpointWriter::hold_writes(std::function<void()> hold) { hold_ = std::move(hold); }

std::string CheckpointWriter::save(ParamStore& params, StepRunner& runner,
                                   const nlohmann::json& state, const std::string& config_text) {
  finish();  // one write at a time
  const auto t0 = Clock::now();
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.step = runner.step_count();
  const std::string name = checkpoint_name(j.step);
  j.final_path = (fs::path(dir_) / name).string();
  j.hold = hold_;
  // the snapshot: a copy when the loop goes on while it is written
  auto keep = [&](const float* data, int64_t n) -> const float* {
    if (!async_) return data;
    j.owned.emplace_back(data, data + n);
    return j.owned.back().data();  // a vector's buffer stays put when `owned` grows
  };
  const std::string state_txt = state_text(state, j.step, config_text);
  if (runner.sharded()) {
    // every rank writes its blocks into rank 0's temporary directory (sharded_checkpoint.h)
    comm::Communicator& world = runner.world();
    j.world = &world;
    j.rank = world.rank();
    int64_t pid = ::getpid();
    std::vector<int64_t> pids(size_t(world.size()));
    world.all_gather(&pid, pids.data(), 8);
    j.tmp = (fs::path(dir_) / fmt::format(".tmp.{}.{}", name, pids[0])).string();
    j.agree(failure_of([&] {
      if (j.rank == 0) make_temp_dir(dir_, j.tmp);
    }));
    runner.refresh_stage_replicas();  // a pipeline: every stage's parameters, current everywhere
    const std::vector<HeldTensor> held = runner.held_tensors();
    std::vector<TensorToWrite> mine = rank_file_tensors(held, runner.mesh(), j.rank);
    for (TensorToWrite& t : mine) t.data = keep(static_cast<const float*>(t.data), numel(t.shape));
    j.tensors.push_back({rank_file_name(j.rank), std::move(mine)});
    if (j.rank == 0)
      j.texts = {{kShardedIndex, sharded_index(held, runner.mesh()).dump(1) + "\n"},
                 {"state.json", state_txt},
                 {"config.toml", config_text}};
  } else {
    runner.push_params();
    if (!writer_) return "";
    std::vector<TensorToWrite> model, opt;
    for (const auto& p : params.infos())
      model.push_back(
          {p.name, DType::f32, p.stored_shape(), keep(params.data(p.name), numel(p.shape))});
    for (const auto& p : params.infos())
      for (autodiff::Moment which : autodiff::kMoments) {
        j.owned.emplace_back(size_t(numel(p.shape)));
        runner.read_moment(p.name, which, j.owned.back().data());
        opt.push_back({autodiff::moment_state_name(which, p.name), DType::f32, p.stored_shape(),
                       j.owned.back().data()});
      }
    j.tmp = (fs::path(dir_) / fmt::format(".tmp.{}.{}", name, ::getpid())).string();
    make_temp_dir(dir_, j.tmp);
    j.tensors = {{"model.safetensors", std::move(model)},
                 {"optimizer.safetensors", std::move(opt)}};
    j.texts = {{"state.json", state_txt}, {"config.toml", config_text}};
  }
  job_ = std::move(job);
  if (async_) {
    job_->thread = std::thread([&j] { j.write(); });
    j.blocked_s = seconds_since(t0);
    return "";
  }
  j.write();
  j.blocked_s = seconds_since(t0);  // commit adds its own time
  return commit(true);
}

std::string CheckpointWriter::poll() { return commit(false); }
std::string CheckpointWriter::finish() { return commit(true); }

std::string CheckpointWriter::commit(bool wait) {
  if (!job_) return "";
  Job& j = *job_;
  const auto t0 = Clock::now();
  if (wait && j.thread.joinable()) j.thread.join();
  const bool done = j.done.load(std::memory_order_acquire);
  if (j.world) {
    // the ranks agree that every write is done before any of them looks at the outcome
    int32_t mine = done ? 1 : 0;
    std::vector<int32_t> all(size_t(j.world->size()), 0);
    j.world->all_gather(&mine, all.data(), 4);
    for (int32_t d : all)
      if (!d) return "";
  } else if (!done) {
    return "";
  }
  if (j.thread.joinable()) j.thread.join();      // done: its last store is behind it
  std::unique_ptr<Job> owned = std::move(job_);  // whatever happens, this write is over
  auto rename_into_place = [&] {
    set_aside(j.final_path);
    std::error_code ec;
    fs::rename(j.tmp, j.final_path, ec);
    if (ec) throw Error(fmt::format("cannot rename {}: {}", j.tmp, ec.message()));
    fsync_directory(dir_);
  };
  if (j.world) {
    j.agree(j.error);
    j.agree(failure_of([&] {
      if (j.rank == 0) rename_into_place();
    }));
    if (j.rank == 0) sweep(dir_, j.step, keep_);
  } else {
    std::string failed = j.error;
    if (failed.empty()) failed = failure_of(rename_into_place);
    if (!failed.empty()) {
      std::error_code ec;
      fs::remove_all(j.tmp, ec);
      throw Error(fmt::format("cannot write checkpoint {}: {}", j.final_path, failed));
    }
    sweep(dir_, j.step, keep_);
  }
  j.blocked_s += seconds_since(t0);  // waiting for the write, the rename, the sweep
  last_ = {.step = j.step, .blocked_s = j.blocked_s, .write_s = j.write_s, .bytes = j.bytes};
  return writer_ ? j.final_path : "";
}

std::string save_checkpoint(const std::string& dir, ParamStore& params, StepRunner& runner,
                            const nlohmann::json& state, const std::string& config_text,
                            int64_t keep, bool writer) {
  return CheckpointWriter(dir, keep, false, writer).save(params, runner, state, config_text);
}

}  // namespace loom::train
