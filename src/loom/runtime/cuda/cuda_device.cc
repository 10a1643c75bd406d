#include "loom/runtime/cuda/cuda_device.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cuda_check.h"

namespace loom::runtime {

namespace {

using kernels::cuda::check;

bool graphs_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_CUDA_GRAPHS");
    return !(v && std::string_view(v) == "0") && !cuda_sync_each();
  }();
  return on;
}

// A program's kernels recorded as one CUDA graph, replayed on the device's stream.
class CudaRecording final : public Recording {
 public:
  CudaRecording(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaRecording() override { cudaGraphExecDestroy(exec_); }
  void replay() override { check(cudaGraphLaunch(exec_, stream_), "replaying a CUDA graph"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// Events on the device's stream: a stamp's time is when the work queued before it finished.
class CudaStamps final : public Stamps {
 public:
  CudaStamps(size_t n, cudaStream_t stream) : events_(n, nullptr), stream_(stream) {
    for (cudaEvent_t& e : events_) check(cudaEventCreate(&e), "creating a timing event");
  }
  ~CudaStamps() override {
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
  }
  void stamp(size_t i) override {
    check(cudaEventRecord(events_.at(i), stream_), "recording a timing event");
  }
  std::vector<double> seconds() override {
    check(cudaStreamSynchronize(stream_), "running the queued kernels");
    std::vector<double> s(events_.size());
    for (size_t i = 1; i < events_.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[0], events_[i]), "reading a timing event");
      s[i] = double(ms) * 1e-3;
    }
    return s;
  }

 private:
  std::vector<cudaEvent_t> events_;
  cudaStream_t stream_;
};

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
    // kernels' stream-ordered scratch (cudaMallocAsync) comes from the default pool; by default
    // the pool hands its memory back at every synchronisation, and the next allocation goes to
    // the driver again: keep it (a step without a CUDA graph synchronises once per step, a
    // profiled one once per node)
    check(cudaDeviceGetDefaultMemPool(&pool_, 0), "reading GPU 0's memory pool");
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep),
          "keeping the memory pool's memory");
    table_ = std::make_unique<KernelTable>(cuda_kernels(stream_));
    opened_used_ = used_bytes();
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
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return p;
  }
  void release(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        live_ -= it->second;
        sizes_.erase(it);
      }
    }
    cudaFree(p);
  }
  int64_t used_bytes() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return int64_t(total - free);
  }
  int64_t peak_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  int64_t take_scratch_high() override { return kernels::cuda::take_scratch_high(); }
  int64_t scratch_reserved_bytes() const override {
    return std::max<int64_t>(0, pool_bytes(cudaMemPoolAttrReservedMemCurrent)) +
           std::max<int64_t>(0, graph_bytes(cudaGraphMemAttrReservedMemCurrent));
  }
  std::vector<std::pair<std::string, int64_t>> memory_detail() const override {
    std::vector<std::pair<std::string, int64_t>> d{{"used_when_opened", opened_used_}};
    auto add = [&](const char* name, int64_t bytes) {
      if (bytes >= 0) d.emplace_back(name, bytes);  // an attribute this driver lacks is left out
    };
    add("pool_reserved", pool_bytes(cudaMemPoolAttrReservedMemCurrent));
    add("pool_reserved_high", pool_bytes(cudaMemPoolAttrReservedMemHigh));
    add("pool_used_high", pool_bytes(cudaMemPoolAttrUsedMemHigh));
    add("graphs_reserved", graph_bytes(cudaGraphMemAttrReservedMemCurrent));
    add("graphs_reserved_high", graph_bytes(cudaGraphMemAttrReservedMemHigh));
    add("graphs_used_high", graph_bytes(cudaGraphMemAttrUsedMemHigh));
    return d;
  }
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
  std::unique_ptr<Recording> record(const std::function<void()>& queue) override {
    if (!graphs_enabled()) return nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
          "starting to record a CUDA graph");
    cudaGraph_t graph = nullptr;
    try {
      queue();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (err != cudaSuccess) {  // something in it cannot be recorded: it runs kernel by kernel
      cudaGetLastError();
      fmt::print(stderr,
                 "loom: a program could not be recorded as a CUDA graph ({}); it runs "
                 "kernel by kernel\n",
                 cudaGetErrorString(err));
      return nullptr;
    }
    // from now on the recording's own memory holds the kernels' scratch: give back the pool's
    // (what the unrecorded runs before it took), so that the scratch is not held twice
    synchronize();
    if (cudaMemPoolTrimTo(pool_, 0) != cudaSuccess) cudaGetLastError();  // then it is only kept
    return std::make_unique<CudaRecording>(exec, stream_);
  }
  std::unique_ptr<Stamps> stamps(size_t n) override {
    return std::make_unique<CudaStamps>(n, stream_);
  }
  void zero(void* dst, int64_t bytes) override {
    if (bytes > 0) check(cudaMemsetAsync(dst, 0, size_t(bytes), stream_), "zeroing GPU memory");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(stream_),
          "running the queued kernels (LOOM_CUDA_SYNC=1 names the node that failed)");
  }

 private:
  // A memory attribute of the pool / of the CUDA graphs, in bytes; -1 where the driver has none.
  int64_t pool_bytes(cudaMemPoolAttr a) const {
    uint64_t v = 0;
    if (cudaMemPoolGetAttribute(pool_, a, &v) == cudaSuccess) return int64_t(v);
    cudaGetLastError();
    return -1;
  }
  static int64_t graph_bytes(cudaGraphMemAttributeType a) {
    uint64_t v = 0;
    if (cudaDeviceGetGraphMemAttribute(0, a, &v) == cudaSuccess) return int64_t(v);
    cudaGetLastError();
    return -1;
  }

  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;  // the default pool kernels' stream-ordered scratch comes from
  std::string describe_;
  int64_t memory_ = 0;
  mutable std::mutex mu_;
  std::map<void*, int64_t> sizes_;  // live allocations
  int64_t live_ = 0, peak_ = 0;
  int64_t opened_used_ = 0;  // used_bytes() once the stream and the kernels' table were made
  std::unique_ptr<KernelTable> table_;
};

}  // namespace

Device& cuda_device() {
  static CudaDevice d;  // a failed construction throws, and the next call tries again
  return d;
}

}  // namespace loom::runtime
