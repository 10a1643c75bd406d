// Writing checkpoints (checkpoint.h's layout and protocol), at once or while training goes on.
//
// A save has four phases:
//   begin    the temporary directory DIR/.tmp.step_XXXXXXXX.<pid of rank 0> (rank 0 creates it;
//            under a plan the ranks agree it exists)
//   collect  what the files hold: the whole parameters and both AdamW moments (a run without a
//            plan), or this rank's blocks (sharded_checkpoint.h); with `async` copied into a
//            snapshot in memory, so that training may go on changing the originals
//   write    the files into the temporary directory, each fsynced: on the calling thread, or with
//            `async` on a thread of its own while the training loop runs on
//   commit   once every rank's write is done (under a plan the ranks agree: one small all-gather
//            at each poll() while a write is under way), rank 0 renames the directory to
//            step_XXXXXXXX, fsyncs DIR and sweeps old checkpoints; a failure on any rank removes
//            the temporary directory and throws on every rank, naming the checkpoint and the rank
//
// So an asynchronous checkpoint keeps checkpoint.h's guarantees: a step_* directory exists only
// complete, and a crash at any point leaves the previous checkpoint the newest (its temporary
// directory is swept by the next save). What it costs is memory: the snapshot holds a copy of
// what this rank writes (parameters and moments, or its blocks of them) until it is written, and
// the loop's next checkpoint first waits for the previous one (one write at a time).
//
// Under a plan every rank constructs a CheckpointWriter and calls save(), poll() and finish() at
// the same points of the loop (they are collective); without one, poll() and finish() only look
// at this process's write.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/train/params.h"
#include "loom/train/step.h"

namespace loom::train {

class CheckpointWriter {
 public:
  // `dir`: the checkpoints' directory; `keep`: [checkpoint] keep (0: all); `writer`: this process
  // writes an unsharded checkpoint's files (sharded runs: every rank writes, rank 0 commits).
  CheckpointWriter(std::string dir, int64_t keep, bool async, bool writer = true);
  // Waits for a write under way. Without a plan a finished write is committed (a run stopping on
  // an error keeps the checkpoint it had written); under a plan the ranks cannot agree here, so
  // an uncommitted checkpoint stays a temporary directory, swept by the next save.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves the runner's parameters, optimizer state and step count with `state` (state.json's
  // caller fields) and `config_text`. A previous asynchronous write is finished first. Returns the
  // checkpoint's path once committed on the writer (synchronous saves), "" otherwise. Throws
  // loom::Error naming the checkpoint on failure, leaving earlier checkpoints intact.
  std::string save(ParamStore& params, StepRunner& runner, const nlohmann::json& state,
                   const std::string& config_text);
  // Commits an asynchronous write that has finished on every rank; returns its path (on the
  // writer) when committed, "" while none is or it is still being written. Throws its failure.
  std::string poll();
  // Waits for an asynchronous write and commits it (its path on the writer, "" if none).
  std::string finish();
  // The step of a write under way (saved but not committed), or -1.
  int64_t pending_step() const;

  // Figures of the last committed checkpoint: seconds the training loop spent in save() (begin,
  // collect and, when synchronous, write), seconds the write took, and bytes written.
  struct Stats {
    int64_t step = -1;
    double blocked_s = 0, write_s = 0;
    int64_t bytes = 0;
  };
  const Stats& last() const { return last_; }

  // Tests: `hold` runs on the writing thread before each write starts (to hold a write back while
  // the loop goes on).
  void hold_writes(std::function<void()> hold);

 private:
  struct Job;
  std::string commit(bool wait);
  std::string dir_;
  int64_t keep_;
  bool async_, writer_;
  std::unique_ptr<Job> job_;
  std::function<void()> hold_;
  Stats last_;
};

}  // namespace loom::train
