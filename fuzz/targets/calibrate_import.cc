// `loom calibrate --import TIMED.json`: kernels timed elsewhere (bench/gpu/torch_kernels.py's or
// loom bench --kernels-out's JSON) read into a profile.
#include "fuzz/fuzz.h"
#include "loom/calibrate/calibrate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("timed.json", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] { (void)loom::calibrate::read_timed(path, 2.0, 0.5); });
  return 0;
}
