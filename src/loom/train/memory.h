// Memory checked before it is allocated: a model or batch that cannot fit in this machine's memory
// is refused with its estimated bytes and the keys that drive them, instead of dying in the
// allocator (std::length_error, SIGSEGV, the OOM killer) or paging for hours.
//
// The estimates are lower bounds, so a config that could fit is never refused: the parameters as
// ParamStore holds them (f32), and for a step runner the parameters' gradients and AdamW moments
// (training) plus the activations no step can do without (per token: one f32 value of d_model per
// layer and the f32 logits). They are compared with MemTotal (/proc/meminfo); where that cannot
// be read nothing is refused.
#pragma once

#include <cstdint>
#include <string>

#include "loom/models/model.h"
#include "loom/train/config.h"

namespace loom::train {

// This machine's memory in bytes (MemTotal), or 0 when unknown.
int64_t machine_memory_bytes();

// Throws loom::Error naming `source` when the parameters of `m` alone (f32) exceed `memory`.
void check_params_fit(const models::ModelConfig& m, const std::string& source, int64_t memory);
// Throws loom::Error naming cfg.path when one rank of `ranks` cannot hold its share of the
// parameters, gradients and moments (`train`) and of the activations of [train] batch_size x
// seq_len tokens. memory_of says whose memory it is ("this machine's", "cuda:0 (NVIDIA H200,
// ...)'s").
void check_step_fits(const Config& cfg, bool train, int64_t ranks, int64_t memory,
                     const std::string& memory_of = "this machine's");

}  // namespace loom::train
