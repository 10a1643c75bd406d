// DiPaCo's router (`loom dipaco route` writes it, `loom dipaco` and `loom sample --path` read it):
// router.safetensors with its loom_router metadata, read and then asked to route a document.
#include "loom/dipaco/router.h"

#include <vector>

#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::put_file("router/router.safetensors", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const loom::dipaco::Router r = loom::dipaco::read_router(loom::fuzz::scratch_dir() + "/router");
    r.check_features(r.dim, "router");
    const std::vector<float> feature(size_t(r.dim), 0.5f);
    const int64_t path = r.route(feature.data());
    if (path < 0 || path >= r.paths()) std::abort();
  });
  return 0;
}
