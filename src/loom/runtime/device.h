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
// Not here: collectives (collectives.h runs them on communicators, whatever the device), streams.
//
// Invariant: a KernelTable holds at most one kernel per (op, device); an op without one is an
// error naming the op and the device when a program that uses it is loaded, never at run time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>

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

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual const KernelTable& kernels() const = 0;
  // `bytes` of device memory aligned to 64 bytes; throws loom::Error when there is not enough.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) = 0;
};

// The process's CPU: its kernels (kernels/cpu through cpu_dispatch.cc) and the heap.
Device& cpu_device();
// The CPU's kernel table (cpu_dispatch.cc), which cpu_device() serves.
const KernelTable& cpu_kernels();

}  // namespace loom::runtime
