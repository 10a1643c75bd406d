// The CUDA device (runtime/device.h): GPU 0 of the process, its memory (cudaMalloc) and one
// stream on which every kernel (cuda_dispatch.cc) and copy is queued in program order.
//
// Example: backend::open(DeviceKind::cuda) returns cuda_device(); an Executor made on it allocates
// its arena with cudaMalloc and queues each node's kernel on the stream; download() of the loss
// waits for the step.
//
// Errors: no GPU visible, or a driver older than the CUDA 13.0 runtime this build links, is a
// loom::Error naming both when the device is first opened. LOOM_CUDA_SYNC=1 synchronises after
// every kernel, so that a fault inside one names its op and node (otherwise it surfaces at the next
// download). An executor's program is recorded as a CUDA graph on its second run and replayed from
// then on (runtime/executor.h); LOOM_CUDA_GRAPHS=0 runs every step kernel by kernel.
#pragma once

#include "loom/runtime/device.h"

namespace loom::runtime {

// The process's CUDA device, opened on first use. Throws loom::Error when there is none.
Device& cuda_device();
// The CUDA kernel table for kernels queued on `stream` (a cudaStream_t).
KernelTable cuda_kernels(void* stream);
// LOOM_CUDA_SYNC=1: every kernel waited for (and no CUDA graphs).
bool cuda_sync_each();

}  // namespace loom::runtime
