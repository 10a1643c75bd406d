// The devices a step can run on, by name: the one place that knows which backends this build has.
// `device = "cpu" | "cuda"` in a config's [train] (train/config.h) is opened here;
// everything below (executor, memory plan, step runner) takes the Device it is given.
//
// Example: backend::open(DeviceKind::cuda) returns the process's GPU in a
// `cmake --preset cuda` build, and throws loom::Error saying how to get one in any other build.
#pragma once

#include "loom/runtime/device.h"

namespace loom::backend {

// The device of that kind, opened on first use. Throws loom::Error when this build lacks the
// backend, or the machine the device (no GPU, a driver too old).
runtime::Device& open(runtime::DeviceKind kind);

}  // namespace loom::backend
