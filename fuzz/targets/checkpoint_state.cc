// A checkpoint's state.json, as `loom train --resume` reads it (train/checkpoint.h). The input is
// split at its first NUL byte: state.json before it, the checkpoint's config.toml after (whose
// checksum state.json may record).
#include <cstring>

#include "fuzz/fuzz.h"
#include "loom/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = loom::fuzz::as_text(data, size);
  const size_t nul = in.find('\0');
  loom::fuzz::put_file("checkpoints/step_00000005/state.json", in.substr(0, nul));
  loom::fuzz::put_file("checkpoints/step_00000005/config.toml",
                       nul == std::string_view::npos ? "" : in.substr(nul + 1));
  loom::fuzz::guard([&] {
    loom::train::read_checkpoint_state(loom::fuzz::scratch_dir() + "/checkpoints/step_00000005");
  });
  return 0;
}
