#include "loom/runtime/device.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "loom/core/error.h"

namespace loom::runtime {

std::string_view device_name(DeviceKind d) {
  switch (d) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::cuda:
      return "cuda";
  }
  return "?";
}

void KernelTable::add(ir::Op op, Kernel k) {
  Kernel& slot = kernels_[size_t(op)];
  LOOM_CHECK(!slot) << "two " << device_name(device_) << " kernels for op " << op;
  slot = std::move(k);
}

const Kernel* KernelTable::find(ir::Op op) const {
  const Kernel& k = kernels_[size_t(op)];
  return k ? &k : nullptr;
}

const Kernel& KernelTable::get(const ir::Graph& g, const ir::Node& n) const {
  if (const Kernel* k = find(n.op)) return *k;
  const std::string value = n.outputs.empty() ? "" : " (%" + g.value(n.outputs[0]).name + ")";
  throw Error(fmt::format("no {} kernel for op {}{}", device_name(device_), n.op, value),
              "run the program on a device that has one, or add the kernel "
              "(docs/extending.md, 'An op')");
}

namespace {

class HostStamps final : public Stamps {
 public:
  explicit HostStamps(size_t n) : t_(n) {}
  void stamp(size_t i) override { t_.at(i) = std::chrono::steady_clock::now(); }
  std::vector<double> seconds() override {
    std::vector<double> s(t_.size());
    for (size_t i = 0; i < t_.size(); ++i)
      s[i] = std::chrono::duration<double>(t_[i] - t_[0]).count();
    return s;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> t_;
};

}  // namespace

std::unique_ptr<Stamps> Device::stamps(size_t n) { return std::make_unique<HostStamps>(n); }

namespace {

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  const KernelTable& kernels() const override { return cpu_kernels(); }
  void* allocate(int64_t bytes) override {
    // aligned_alloc wants a multiple of the alignment
    const auto rounded = size_t((bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw Error(fmt::format("cannot allocate {} MiB of CPU memory", bytes >> 20));
    return p;
  }
  void release(void* p) override { std::free(p); }
  std::string describe() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  int64_t memory_bytes() const override { return 0; }
  void upload(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, size_t(bytes));
  }
  void download(void* dst, const void* src, int64_t bytes) override { upload(dst, src, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) override { upload(dst, src, bytes); }
  void zero(void* dst, int64_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, size_t(bytes));
  }
  void synchronize() override {}
};

}  // namespace

Device& cpu_device() {
  static CpuDevice d;
  return d;
}

}  // namespace loom::runtime
