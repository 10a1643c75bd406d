#include "loom/backend/backend.h"

#include <fmt/format.h>

#include "loom/core/error.h"
#ifdef LOOM_HAS_CUDA
#include "loom/runtime/cuda/cuda_device.h"
#endif

namespace loom::backend {

using runtime::DeviceKind;

runtime::Device& open(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return runtime::cpu_device();
#ifdef LOOM_HAS_CUDA
  return runtime::cuda_device();
#else
  throw Error(
      "device = \"cuda\": this loom was built without the CUDA backend",
      "build it with `cmake --preset cuda && cmake --build --preset cuda` (scripts/setup.sh "
      "--cuda installs the compiler), or set device = \"cpu\"");
#endif
}

}  // namespace loom::backend
