// Training checkpoints: one directory per step, written so that a crash never leaves a half
// checkpoint where a reader would take it for a whole one.
//
//   DIR/step_00000100/
//     model.safetensors      every parameter (f32) under its Hugging Face name
//     optimizer.safetensors  "adam.m.<name>", "adam.v.<name>" (f32)
//     (a run under a [plan] writes its ranks' blocks instead: index.json and
//      rank-NNNNN.safetensors, sharded_checkpoint.h)
//     state.json             {"format": 1, "step": 100, "config_crc32": ..., "crc32": ...,
//                             ...caller's state (data loader, RNG)}
//     config.toml            the resolved config text
//
// Integrity: both safetensors files carry each tensor's CRC-32 (write_safetensors), state.json
// the CRC-32 of config.toml and of its own other fields; loading verifies all of them (older
// checkpoints without them load as before) and names the damaged file and tensor.
//
// Write protocol: everything goes into DIR/.tmp.step_00000100.<pid>/ (each file fsynced), which is
// renamed to step_00000100 and DIR is fsynced. A step_* directory therefore exists only complete;
// leftover .tmp.* directories (a crash mid-write) are ignored and swept by the next save. After a
// successful save, all but the newest `keep` checkpoints are removed. checkpoint_writer.h writes
// them, at once (save_checkpoint) or while training goes on (`[checkpoint] async`).
//
// Loading checks every tensor's name, dtype and shape against the model and names the file on any
// mismatch or corruption.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/train/config.h"
#include "loom/train/params.h"
#include "loom/train/step.h"

namespace loom::train {

std::string checkpoint_name(int64_t step);  // "step_00000100"
// The step a checkpoint's directory name holds ("step_00000100": 100), or -1 for another name.
int64_t checkpoint_step(const std::string& name);

// Saves params, the runner's optimizer state and step count, `state` and `config_text` at once (a
// synchronous CheckpointWriter); returns the checkpoint's path (on the `writer` rank; "" on the
// others). Throws loom::Error naming the path on failure, leaving earlier checkpoints intact. A
// sharded run calls it on every rank (collective): each rank writes its own blocks into rank 0's
// temp directory, never gathering a tensor, and rank 0 the index (sharded_checkpoint.h); the
// checkpoint loads under any plan or none. Then it sweeps: of the checkpoints up to this step, the
// newest `keep` stay (0: all), the one just written always among them; checkpoints of later steps
// (a resume passed them over as damaged) are neither counted nor deleted.
std::string save_checkpoint(const std::string& dir, ParamStore& params, StepRunner& runner,
                            const nlohmann::json& state, const std::string& config_text,
                            int64_t keep, bool writer = true);

// The newest complete checkpoint in `dir` (by step), if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);
std::vector<std::string> list_checkpoints(const std::string& dir);  // oldest first

// A run directory, as loom train writes it (config.toml, checkpoints/), read by loom sample and
// loom export.
// Its resolved config; throws loom::Error naming the run dir if it or its config.toml is missing.
Config load_run_config(const std::string& run_dir);
// `path` itself if it is a file, `path`/model.safetensors if it is a directory holding one,
// `path` if it is a sharded checkpoint (train::Weights reads it), else none.
std::optional<std::string> model_file(const std::string& path);
// The weights to read: `choice` (a checkpoint directory or a .safetensors file) when given, else
// the newest checkpoint's model.safetensors (or the checkpoint itself when sharded). Throws
// loom::Error naming the path.
std::string run_weights(const std::string& run_dir, const std::string& choice);

// Checkpoint `path`'s state.json, validated: a JSON object of format 1 whose integer "step" is in
// [0, 2^40] and the one its directory is named for (step_XXXXXXXX), matching the checksums it
// records of itself and of the checkpoint's config.toml (checkpoints written before them have
// none). Throws loom::Error naming the file and what is wrong.
nlohmann::json read_checkpoint_state(const std::string& path);

// Restores params, optimizer state and step count; returns state.json (read_checkpoint_state).
// Whole or sharded: a sharded runner reads a sharded checkpoint's blocks that overlap its own
// (under any plan), anything else reads whole tensors (a sharded checkpoint's assembled) and a
// sharded runner takes its blocks of them.
nlohmann::json load_checkpoint(const std::string& path, ParamStore& params, StepRunner& runner);

}  // namespace loom::train
