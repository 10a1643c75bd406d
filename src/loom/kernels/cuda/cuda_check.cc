#include "loom/kernels/cuda/cuda_check.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <atomic>

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

namespace {
std::atomic<int64_t> scratch_high{0};
}  // namespace

void note_scratch(int64_t bytes) {
  int64_t seen = scratch_high.load(std::memory_order_relaxed);
  while (bytes > seen && !scratch_high.compare_exchange_weak(seen, bytes)) {
  }
}

int64_t take_scratch_high() { return scratch_high.exchange(0); }

}  // namespace loom::kernels::cuda
