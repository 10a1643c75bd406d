#include "loom/dipaco/paths.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "loom/core/error.h"

namespace loom::dipaco {

std::vector<int64_t> Paths::digits(size_t p) const {
  std::vector<int64_t> d(modules.size());
  for (size_t l = modules.size(); l-- > 0;) {
    d[l] = int64_t(p) % modules[l];
    p /= size_t(modules[l]);
  }
  return d;
}

std::string Paths::name(size_t p) const { return fmt::format("{}", fmt::join(digits(p), ".")); }

Paths layout(const TensorList& model, const std::vector<int64_t>& modules) {
  if (modules.empty()) throw Error("[outer] modules: DiPaCo needs at least one level");
  int64_t count = 1;
  for (size_t l = 0; l < modules.size(); ++l) {
    if (modules[l] < 1)
      throw Error(
          fmt::format("[outer] modules: level {} has {} modules; at least 1", l, modules[l]));
    count *= modules[l];
    if (count > kMaxPaths)
      throw Error(fmt::format("[outer] modules: more than {} paths", kMaxPaths));
  }
  const int64_t levels = int64_t(modules.size());
  // each block's ordinal, in order of appearance
  std::map<int64_t, int64_t> ordinal;
  std::vector<int64_t> block(model.size(), -1);
  for (size_t i = 0; i < model.size(); ++i)
    if (model[i].layer >= 0)
      block[i] = ordinal.emplace(model[i].layer, int64_t(ordinal.size())).first->second;
  const int64_t n = int64_t(ordinal.size());
  if (n < levels)
    throw Error(fmt::format("[outer] modules: {} levels, but the model has {} block(s); a level "
                            "holds at least one",
                            levels, n),
                "give [outer] modules at most one entry per block");
  Paths out;
  out.modules = modules;
  out.level.resize(model.size());
  bool seen_block = false;
  for (size_t i = 0; i < model.size(); ++i) {
    if (block[i] >= 0) seen_block = true;
    out.level[i] = block[i] >= 0 ? block[i] * levels / n : seen_block ? levels - 1 : 0;
  }
  // the table: level by level, module by module; first[l][m]: where module (l, m) starts
  std::vector<std::vector<size_t>> first = std::vector<std::vector<size_t>>(size_t(levels));
  std::vector<size_t> rank(model.size());  // the tensor's index within its level
  for (int64_t l = 0; l < levels; ++l) {
    size_t r = 0;
    for (size_t i = 0; i < model.size(); ++i)
      if (out.level[i] == l) rank[i] = r++;
    for (int64_t m = 0; m < modules[size_t(l)]; ++m) {
      first[size_t(l)].push_back(out.table.size());
      for (size_t i = 0; i < model.size(); ++i)
        if (out.level[i] == l)
          out.table.push_back(
              {fmt::format("l{}m{}/{}", l, m, model[i].name), model[i].shape, {}, model[i].layer});
    }
  }
  out.path.resize(size_t(count));
  for (size_t p = 0; p < size_t(count); ++p) {
    const std::vector<int64_t> d = out.digits(p);
    for (size_t i = 0; i < model.size(); ++i) {
      const size_t l = size_t(out.level[i]);
      out.path[p].push_back(first[l][size_t(d[l])] + rank[i]);
    }
  }
  return out;
}

TensorList module_table(const Paths& paths, const TensorList& model) {
  TensorList t = train::zeros_like(paths.table);
  for (const auto& which : paths.path)
    for (size_t i = 0; i < which.size(); ++i) t[which[i]].data = model[i].data;
  return t;
}

TensorList path_view(const Paths& paths, size_t p, const TensorList& table,
                     const TensorList& model_spec) {
  TensorList out = train::gather(table, paths.path[p]);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].name = model_spec[i].name;
    out[i].layer = model_spec[i].layer;
  }
  return out;
}

}  // namespace loom::dipaco
