// Error checks shared by the CUDA kernel files (.cu) and the CUDA device (runtime/cuda/): a failed
// CUDA call or kernel launch becomes a loom::Error naming what was attempted and CUDA's own words.
// The throwing half lives in a host-compiled file (cuda_check.cc) so that .cu files need no Loom
// header beyond this one. Also the count of the kernels' stream-ordered scratch, which the memory
// plan does not hold (what a profiled run reports per node: Device::take_scratch_high).
#pragma once

#include <cstdint>

namespace loom::kernels::cuda {

// Throws loom::Error("CUDA: <what>: <cudaGetErrorString(err)>") unless err == 0 (cudaSuccess).
// err is a cudaError_t passed as int, keeping this header free of CUDA headers.
void check(int err, const char* what);
// After a kernel launch: checks cudaGetLastError() (a bad configuration, no kernel image for this
// GPU); does not synchronise, so faults inside the kernel surface at the next synchronisation.
void check_launch(const char* kernel);

// Every stream-ordered temporary a kernel takes (cudaMallocAsync beside the arena: column sums'
// partials, cuDNN's workspace) is noted here with its bytes; take_scratch_high() returns the
// largest noted since its last call and starts again from 0.
void note_scratch(int64_t bytes);
int64_t take_scratch_high();

}  // namespace loom::kernels::cuda
