#include "loom/dipaco/config_section.h"

#include <algorithm>

#include "loom/config/schema.h"

namespace loom::dipaco {

std::vector<config::Key<PathsConfig>> path_keys() {
  using namespace config;
  using P = PathsConfig;
  return {
      int_list_key("modules", &P::modules, closed(1, 64), 8,
                   "DiPaCo: modules per level, as [2, 2] (the blocks cut into that many levels; a "
                   "path takes one module per level); sync mode, one fragment"),
      int_key("path", &P::path, closed(0, kMaxPaths - 1),
              "DiPaCo: the path this island trains (less than the product of modules)"),
      string_key("router", &P::router,
                 "DiPaCo: the directory `loom dipaco route` wrote (`loom islands` gives island i "
                 "path i mod paths, and that path's data)"),
  };
}

void check_paths(const PathsConfig& c, const config::Fail& fail) {
  if (c.enabled()) {
    int64_t paths = 1;
    for (int64_t m : c.modules)
      if ((paths *= m) > kMaxPaths)
        fail("[outer] modules",
             fmt::format("more than {} paths (the product of the modules per level)", kMaxPaths));
  }
  if (c.path >= std::max<int64_t>(c.paths(), 1))
    fail("[outer] path",
         c.modules.empty()
             ? fmt::format("{}: a DiPaCo path needs [outer] modules", c.path)
             : fmt::format("must be less than the {} paths of [outer] modules, got {}", c.paths(),
                           c.path));
  if (!c.router.empty() && c.modules.empty())
    fail("[outer] router", "a DiPaCo router needs [outer] modules");
}

}  // namespace loom::dipaco
