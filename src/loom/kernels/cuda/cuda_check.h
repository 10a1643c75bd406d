// Error checks shared by the CUDA kernel files (.cu) and the CUDA device (runtime/cuda/): a failed
// CUDA call or kernel launch becomes a loom::Error naming what was attempted and CUDA's own words.
// The throwing half lives in a host-compiled file (cuda_check.cc) so that .cu files need no Loom
// header beyond this one.
#pragma once

namespace loom::kernels::cuda {

// Throws loom::Error("CUDA: <what>: <cudaGetErrorString(err)>") unless err == 0 (cudaSuccess).
// err is a cudaError_t passed as int, keeping this header free of CUDA headers.
void check(int err, const char* what);
// After a kernel launch: checks cudaGetLastError() (a bad configuration, no kernel image for this
// GPU); does not synchronise, so faults inside the kernel surface at the next synchronisation.
void check_launch(const char* kernel);

}  // namespace loom::kernels::cuda
