#include "loom/dipaco/choose.h"

#include <fmt/format.h>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/dipaco/router.h"
#include "loom/train/checkpoint.h"
#include "loom/train/params.h"

namespace loom::dipaco {

PathChoice choose_path(const std::string& run, const std::string& spec,
                       const EncodePrompt& encode) {
  if (!path_exists(run + "/path_0"))
    throw Error(fmt::format("--path {}: {} is not a DiPaCo run (it holds no path_0: loom islands "
                            "with [outer] modules writes one directory per path)",
                            spec, run),
                "leave --path out to sample from a run of one model");
  const train::Config pc = train::load_run_config(run + "/path_0");
  if (pc.outer.dipaco.router.empty())
    throw Error(
        fmt::format("{}: not a DiPaCo run ([outer] router is not set in "
                    "path_0/config.toml)",
                    run));
  const Router router = read_router(pc.outer.dipaco.router);
  router.check_features(pc.model.vocab_size, pc.outer.dipaco.router);
  PathChoice c;
  if (spec == "auto") {
    std::vector<int32_t> head = encode(run + "/path_0", pc);
    if (int64_t(head.size()) > router.prefix) head.resize(size_t(router.prefix));
    train::ParamStore base(pc.model);
    base.load(pc.outer.dipaco.router + "/base.safetensors");
    c.path = router.route(features(pc.model, base, {head}, router.prefix).data());
    c.routed = true;
  } else {
    try {
      size_t used = 0;
      c.path = std::stoll(spec, &used);
      if (used != spec.size()) c.path = -1;
    } catch (const std::exception&) {
      c.path = -1;
    }
    if (c.path < 0 || c.path >= router.paths())
      throw Error(
          fmt::format("--path {}: expected auto or a path in [0, {})", spec, router.paths()));
  }
  c.run = fmt::format("{}/path_{}", run, c.path);
  return c;
}

}  // namespace loom::dipaco
