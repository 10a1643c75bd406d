#include "loom/shard/config_section.h"

#include <algorithm>

#include "loom/config/schema.h"
#include "loom/shard/tactic.h"

namespace loom::shard {

namespace {

using config::Key;

// mesh = { data = 2, model = 2 }: axis sizes, in the order written.
Key<Plan> mesh_key() {
  return {"mesh",
          "table of ints",
          [](Plan& p, const toml::node& n, const std::string& where) {
            const toml::table* t = n.as_table();
            if (!t || t->empty())
              throw Error(where + ": expected a table of axis sizes",
                          "mesh = { data = 2, model = 2 }");
            // toml++ keeps keys sorted; the mesh keeps the order they were written in
            std::vector<std::pair<toml::source_position, std::pair<std::string, int64_t>>> axes;
            for (const auto& [k, v] : *t) {
              auto size = config::integer_in(v);
              if (!size)
                throw Error(fmt::format("{}: axis {} needs an integer size", where, k.str()));
              axes.push_back({k.source().begin, {std::string(k.str()), *size}});
            }
            std::stable_sort(axes.begin(), axes.end(), [](const auto& a, const auto& b) {
              return a.first.line != b.first.line ? a.first.line < b.first.line
                                                  : a.first.column < b.first.column;
            });
            std::vector<std::pair<std::string, int64_t>> m;
            for (auto& a : axes) m.push_back(std::move(a.second));
            p.mesh = Mesh(std::move(m), where);
          },
          nullptr,
          {},
          "none (one process)",
          "axis = size, each >= 1, at most 2^24 devices in all",
          {}};
}

// The tactics key's meaning, from the tactic table: "`{ kind, axis }`: data, fsdp, ...;
// `{ kind = "shard", pattern, dim, axis }` (docs/plans.md)".
std::string tactics_help() {
  std::string plain, patterned;
  for (const TacticDef& d : tactic_defs())
    if (d.takes_pattern)
      patterned += fmt::format(" `{{ kind = \"{}\", pattern, dim, axis }}`", d.name);
    else
      plain += fmt::format("{}{}", plain.empty() ? "" : ", ", d.name);
  return fmt::format(
      "`{{ kind, axis }}`: {};{}; pipeline also reads `schedule` (`\"gpipe\"`, `\"1f1b\"` or "
      "`\"interleaved\"`), `microbatches` (default: its axis's size) and `virtual_stages` "
      "(interleaved: model chunks per stage, default 2) (docs/plans.md)",
      plain, patterned);
}

// One entry of tactics = [ ... ], `at` naming it.
Tactic read_tactic(const toml::node& entry, const std::string& at) {
  const toml::table* t = entry.as_table();
  if (!t) throw Error(at + ": expected a table { kind = ..., axis = ... }");
  Tactic tac;
  std::vector<std::string> pipeline_keys;
  for (const auto& [k, node] : *t) {
    std::string key(k.str());
    const toml::node& v = node;  // a structured binding clang 14 cannot capture
    auto str = [&]() {
      if (!v.is_string()) throw Error(fmt::format("{}: {} must be a string", at, key));
      return *v.value<std::string>();
    };
    if (key == "kind")
      tac.kind = str();
    else if (key == "axis")
      tac.axis = str();
    else if (key == "pattern")
      tac.pattern = str();
    else if (key == "dim") {
      if (!v.is_integer()) throw Error(fmt::format("{}: dim must be an integer", at));
      tac.dim = *v.value<int64_t>();
    } else if (key == "schedule") {
      tac.schedule = str();
      pipeline_keys.push_back(key);
    } else if (key == "microbatches") {
      if (!v.is_integer() || *v.value<int64_t>() < 1)
        throw Error(fmt::format("{}: microbatches must be an integer >= 1", at));
      tac.microbatches = *v.value<int64_t>();
      pipeline_keys.push_back(key);
    } else if (key == "virtual_stages") {
      if (!v.is_integer() || *v.value<int64_t>() < 1)
        throw Error(fmt::format("{}: virtual_stages must be an integer >= 1", at));
      tac.virtual_stages = *v.value<int64_t>();
      pipeline_keys.push_back(key);
    } else {
      throw Error(fmt::format("{}: unknown key '{}'", at, key),
                  suggest(key, {"kind", "axis", "pattern", "dim", "schedule", "microbatches",
                                "virtual_stages"}));
    }
  }
  const TacticDef* def = find_tactic(tac.kind);
  if (!def)
    throw Error(fmt::format("{}: unknown tactic kind '{}'", at, tac.kind),
                suggest(tac.kind, tactic_kinds()));
  if (tac.axis.empty()) throw Error(at + ": missing key 'axis'");
  if (tac.kind != "pipeline" && !pipeline_keys.empty())
    throw Error(fmt::format("{}: a {} tactic takes no {}", at, def->name, pipeline_keys[0]),
                "only { kind = \"pipeline\", axis, schedule, microbatches, virtual_stages } "
                "reads it");
  if (tac.kind == "pipeline") check_pipeline_keys(tac, at);
  if (def->takes_pattern && (tac.pattern.empty() || tac.dim < 0))
    throw Error(fmt::format("{}: a {} tactic needs pattern and dim", at, def->name),
                "{ kind = \"shard\", pattern = \"lm_head.weight\", dim = 0, axis = \"model\" }");
  if (!def->takes_pattern && (!tac.pattern.empty() || tac.dim >= 0))
    throw Error(fmt::format("{}: a {} tactic takes no pattern or dim", at, def->name),
                "only { kind = \"shard\", pattern, dim, axis } reads them");
  return tac;
}

// tactics = [ { kind = "fsdp", axis = "data" }, ... ]
Key<Plan> tactics_key() {
  return {"tactics",
          "array of tables",
          [](Plan& p, const toml::node& n, const std::string& where) {
            const toml::array* a = n.as_array();
            if (!a)
              throw Error(where + ": expected an array of tables",
                          "tactics = [ { kind = \"fsdp\", axis = \"data\" } ]");
            p.tactics.clear();
            for (size_t i = 0; i < a->size(); ++i)
              p.tactics.push_back(read_tactic((*a)[i], fmt::format("{}[{}]", where, i)));
          },
          nullptr,
          {},
          "none",
          tactics_help(),
          {}};
}

}  // namespace

const config::Section<Plan>& plan_section() {
  static const config::Section<Plan> s{
      "plan", {mesh_key(), tactics_key()}, [](Plan& p, const config::Fail& fail) {
        if (p.empty() && !p.tactics.empty())
          fail("[plan] tactics", "need a mesh: add [plan] mesh = { data = 2 }");
        for (size_t i = 0; i < p.tactics.size(); ++i)  // here, so that loom config says it too
          if (!p.empty() && !p.mesh.has(p.tactics[i].axis))
            fail("[plan] tactics",
                 fmt::format("tactics[{}] ({}): axis '{}' is not in the mesh {}", i,
                             p.tactics[i].kind, p.tactics[i].axis, p.mesh.to_string()));
      }};
  return s;
}

}  // namespace loom::shard
