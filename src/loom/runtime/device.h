// Device: what the executor needs from the hardware it runs a program on — a kernel per op and
// the memory its arena lives in — and nothing else. The executor, the memory plan and everything
// above them are device-agnostic: they ask `device.kernels().find(n.op)` and
// `device.allocate(bytes)`, never name a kernel. A backend is one Device implementation plus the
// kernel table it fills (the CPU's: cpu_dispatch.cc; a CUDA backend adds cuda_device.cc and its own
// table beside it).
//
// Example: running node `%y = rmsnorm(%x, %w)` on the CPU looks up
// cpu_device().kernels().find(Op::rmsnorm) once, when the executor is made, and calls it with
// pointers into cpu_device()'s arena on every run.
//
// A device other than the CPU has memory of its own: the executor's arena and every buffer bound to
// it live there, and host memory reaches it only by upload() and download(), at a step's edges
// (batch in; loss, metrics, checkpoints out). Kernels are queued in order on the device's stream;
// download() and synchronize() wait for them.
//
// Not here: collectives (collectives.h runs them on communicators, whatever the device); which
// devices a build has (backend/backend.h opens one by kind).
//
// Invariant: a KernelTable holds at most one kernel per (op, device); an op without one is an
// error naming the op and the device when a program that uses it is loaded, never at run time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::runtime {

enum class DeviceKind : uint8_t { cpu, cuda };
std::string_view device_name(DeviceKind d);  // "cpu", "cuda"

// An op's kernel on one device: ins/outs point at each input/output's data in that device's
// memory. Throws loom::Error for input it rejects (e.g. a token id outside the vocabulary).
using Kernel =
    std::function<void(const ir::Graph&, const ir::Node&, void* const* ins, void* const* outs)>;

// A device's kernels, indexed by op.
class KernelTable {
 public:
  explicit KernelTable(DeviceKind device) : device_(device) {}
  // Registers op's kernel; LOOM_CHECKs that it has none yet.
  void add(ir::Op op, Kernel k);
  // Null when the device has no kernel for op.
  const Kernel* find(ir::Op op) const;
  // The kernel of node n's op; throws loom::Error naming the op, the node and the device if none.
  const Kernel& get(const ir::Graph& g, const ir::Node& n) const;
  DeviceKind device() const { return device_; }

 private:
  DeviceKind device_;
  std::array<Kernel, ir::kOpCount> kernels_;
};

// Work a device recorded once and replays as a whole (on a GPU, a CUDA graph: one launch for a
// program's every kernel).
class Recording {
 public:
  virtual ~Recording() = default;
  virtual void replay() = 0;
};

// Time stamps in the order of a device's queue, to time each piece of queued work without waiting
// for it (an executor's profile): stamp(i) marks when everything queued before it has finished
// (on a GPU an event on its stream; on the CPU, whose kernels run as they are queued, the host's
// clock). seconds() waits for the queue and returns each stamp's time, in seconds from an
// arbitrary origin shared by the stamps of one object.
class Stamps {
 public:
  virtual ~Stamps() = default;
  virtual void stamp(size_t i) = 0;  // i < the count the object was made for
  virtual std::vector<double> seconds() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual const KernelTable& kernels() const = 0;
  // What it is, for logs and errors: "cpu", "cuda:0 (NVIDIA H200, sm_90, 139 GiB)".
  virtual std::string describe() const = 0;
  // True when the device computes on host memory (the CPU): host buffers are bound as they are,
  // and upload/download are plain copies.
  virtual bool host_memory() const = 0;
  // The device's own memory in bytes (what a step is checked against before it is compiled); 0
  // for the CPU, whose memory is the machine's (train/memory.h reads it).
  virtual int64_t memory_bytes() const = 0;
  // `bytes` of device memory aligned to 64 bytes (256 on a GPU); throws loom::Error naming the
  // bytes asked for and the device when there is not enough.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Host -> device and device -> host copies, in order with the queued kernels; download returns
  // once the data is on the host. copy: device -> device, queued.
  virtual void upload(void* dst, const void* src, int64_t bytes) = 0;
  virtual void download(void* dst, const void* src, int64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  // Sets bytes of device memory to 0, queued (no host buffer).
  virtual void zero(void* dst, int64_t bytes) = 0;
  // Waits until every queued kernel and copy has finished; throws loom::Error for a fault inside
  // one (which a GPU reports only here).
  virtual void synchronize() = 0;
  // The most bytes allocate() had handed out at once (0 on the CPU, whose peak is the process's
  // RSS).
  virtual int64_t peak_bytes() const { return 0; }
  // The device's memory in use now by the driver's count, this process's runtime included (a GPU's
  // context, libraries' workspaces, the stream-ordered pool); 0 on the CPU.
  virtual int64_t used_bytes() const { return 0; }
  // Where used_bytes goes beside the allocations, by name (a GPU: its use when opened, the
  // stream-ordered pool's and the CUDA graphs' own memory); empty on the CPU.
  virtual std::vector<std::pair<std::string, int64_t>> memory_detail() const { return {}; }
  // The largest temporary a kernel took beside the allocations (a GPU's stream-ordered scratch:
  // column sums' partials, cuDNN's workspace) since the last call, which starts the count again;
  // 0 where kernels take none (the CPU's work in the arena or on their own stacks).
  virtual int64_t take_scratch_high() { return 0; }
  // What the device holds now for such temporaries (a GPU: its stream-ordered pool and its CUDA
  // graphs' memory), part of used_bytes.
  virtual int64_t scratch_reserved_bytes() const { return 0; }
  // Records what `queue` puts on this device (kernels, copies) without running it, for replay; null
  // when the device records nothing (the CPU; a GPU with LOOM_CUDA_GRAPHS=0) or could not record
  // what `queue` did (then nothing of it ran: the caller runs it as it is).
  virtual std::unique_ptr<Recording> record(const std::function<void()>& queue) { return nullptr; }
  // n stamps on this device's queue (the default: the host's clock, for a device whose kernels
  // have finished when they return).
  virtual std::unique_ptr<Stamps> stamps(size_t n);
};

// `bytes` of a device's memory, released when the Buffer goes.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device& d, int64_t bytes)
      : d_(&d), p_(bytes > 0 ? d.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~Buffer() {
    if (p_) d_->release(p_);
  }
  Buffer(Buffer&& o) noexcept : d_(o.d_), p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* data() const { return p_; }
  int64_t bytes() const { return bytes_; }

 private:
  Device* d_ = nullptr;
  void* p_ = nullptr;
  int64_t bytes_ = 0;
};

// The process's CPU: its kernels (kernels/cpu through cpu_dispatch.cc) and the heap.
Device& cpu_device();
// The CPU's kernel table (cpu_dispatch.cc), which cpu_device() serves.
const KernelTable& cpu_kernels();

}  // namespace loom::runtime
