#include "loom/kernels/cuda/cuda_check.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "loom/core/error.h"

namespace loom::kernels::cuda {

void check(int err, const char* what) {
  if (err == cudaSuccess) return;
  throw Error(fmt::format("CUDA: {}: {}", what, cudaGetErrorString(cudaError_t(err))));
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  throw Error(fmt::format("CUDA: launching {}: {}", kernel, cudaGetErrorString(err)));
}

}  // namespace loom::kernels::cuda
