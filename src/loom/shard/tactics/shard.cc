// shard: the user's own split. Splits dim `dim` of every value whose name matches the glob
// `pattern` (`*` any run of characters): the one tactic that reads names, because they are the
// user's (`loom inspect CONFIG --stage train` lists them).
#include <fmt/format.h>
#include <fnmatch.h>

#include "loom/core/error.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

TacticDef shard_tactic() {
  return {.name = "shard",
          .summary = "split dim `dim` of every value whose name matches `pattern`",
          .selects = "the values the user's glob names",
          .takes_pattern = true,
          .apply = [](TacticContext& c, const Tactic& t) {
            int matched = 0;
            for (const ir::Value& v : c.graph().values()) {
              if (fnmatch(t.pattern.c_str(), v.name.c_str(), 0) != 0) continue;
              ++matched;
              if (t.dim < 0 || t.dim >= int64_t(v.type.shape.size()))
                throw Error(fmt::format("{}: value %{} ({}) has no dim {}", c.by(), v.name,
                                        ir::type_str(v.type), t.dim));
              c.split(v.id, size_t(t.dim));
            }
            if (!matched)
              throw Error(fmt::format("{}: pattern '{}' matches no value", c.by(), t.pattern),
                          "`loom inspect CONFIG --stage train` lists the value names");
          }};
}

}  // namespace loom::shard
