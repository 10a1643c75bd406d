// Predicting one plan: a config's training step compiled as `loom train` compiles it (the
// scheduled per-rank program under its [plan] and [passes]; without a plan, the one-process
// training graph) and simulated on a cluster (sim/). `loom plan` prints it; plan search
// (search.h) ranks candidates by it.
//
// MFU: the model's FLOPs per token (models::train_flops_per_token) x tokens per step per device,
// over step time x peak FLOP/s of the model's dtype; HFU counts what the program executes
// (recomputation included). Energy per step: devices x step x (idle + (peak - idle) x the compute
// stream's busy fraction) x PUE; CO2 is that times the grid's carbon intensity.
//
// Throws loom::Error for a plan that does not compile, or a mesh whose size is not the device
// count.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/passes/pass.h"
#include "loom/sim/cluster.h"
#include "loom/train/config.h"

namespace loom::search {

// One JSON object: plan, cluster, devices, mesh, step_ms, tokens_per_s(_per_device), mfu, hfu,
// compute_ms(_by_op), exposed_comm_ms, collectives_per_step, planned_bytes, peak_bytes, fits,
// bytes_per_level, bytes_per_axis, energy and CO2 per step and per million tokens. `kernels`
// (optional) gathers the programs' distinct compute kernels (`loom plan --kernels`). `trained`
// (optional): cfg's training graph compiled to passes::Stage::train, reused instead of compiled.
nlohmann::json predict(const train::Config& cfg, const std::shared_ptr<const sim::Cluster>& cluster,
                       int64_t devices, const std::string& name, nlohmann::json* kernels = nullptr,
                       const passes::Compilation* trained = nullptr);

}  // namespace loom::search
