// `loom calibrate --import TIMED.json`: kernels another machine timed (bench/gpu/torch_kernels.py's
// JSON) read into a profile.
#include "fuzz/fuzz.h"
#include "loom/calibrate/calibrate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("timed.json", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    std::string device, torch;
    (void)loom::calibrate::import_profile(path, 2.0, 0.5, &device, &torch);
  });
  return 0;
}
