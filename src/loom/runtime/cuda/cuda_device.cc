#include "loom/runtime/cuda/cuda_device.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <memory>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cuda_check.h"

namespace loom::runtime {

namespace {

using kernels::cuda::check;

class CudaDevice final : public Device {
 public:
  CudaDevice() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
      throw Error(fmt::format("device = \"cuda\": no CUDA GPU can be used ({})",
                              err != cudaSuccess ? cudaGetErrorString(err) : "none visible"),
                  "run on a machine with an NVIDIA GPU and a driver for CUDA 13.0 or newer, or "
                  "set device = \"cpu\"");
    check(cudaSetDevice(0), "selecting GPU 0");
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, 0), "reading GPU 0's properties");
    memory_ = int64_t(p.totalGlobalMem);
    describe_ = fmt::format("cuda:0 ({}, sm_{}{}, {} GiB)", p.name, p.major, p.minor,
                            p.totalGlobalMem >> 30);
    if (p.major < 9)
      throw Error(
          fmt::format("device = \"cuda\": {} is older than this build's sm_90a kernels", describe_),
          "run on an H100 or H200, or set device = \"cpu\"");
    // a blocking stream: work queued on the legacy default stream (a test's direct kernel calls)
    // is ordered with it
    check(cudaStreamCreate(&stream_), "creating a stream");
    table_ = std::make_unique<KernelTable>(cuda_kernels(stream_));
  }
  DeviceKind kind() const override { return DeviceKind::cuda; }
  const KernelTable& kernels() const override { return *table_; }
  std::string describe() const override { return describe_; }
  bool host_memory() const override { return false; }
  int64_t memory_bytes() const override { return memory_; }
  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, size_t(bytes));
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear it: an allocation failure is not sticky
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw Error(fmt::format("cannot allocate {} MiB on {}: {} ({} MiB free)", bytes >> 20,
                              describe_, cudaGetErrorString(err), free >> 20));
    }
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void upload(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, stream_),
          "copying to the GPU");
    // the host buffer may change as soon as this returns
    synchronize();
  }
  void download(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, stream_),
          "copying from the GPU");
    synchronize();
  }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0 || dst == src) return;
    check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, stream_),
          "copying on the GPU");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(stream_),
          "running the queued kernels (LOOM_CUDA_SYNC=1 names the node that failed)");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::string describe_;
  int64_t memory_ = 0;
  std::unique_ptr<KernelTable> table_;
};

}  // namespace

Device& cuda_device() {
  static CudaDevice d;  // a failed construction throws, and the next call tries again
  return d;
}

}  // namespace loom::runtime
