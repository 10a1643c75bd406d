#include "loom/outer/fragments.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "loom/core/error.h"

namespace loom::outer {

Fragments split_fragments(const TensorList& spec, int64_t f) {
  if (f < 1) throw Error(fmt::format("[outer] fragments = {}: at least 1", f));
  Fragments out = Fragments(size_t(f));
  if (f == 1) {
    for (size_t i = 0; i < spec.size(); ++i) out[0].push_back(i);
    return out;
  }
  // each tensor's layer as its ordinal among the distinct layers, in order of appearance
  std::map<int64_t, size_t> ordinal;
  std::vector<std::optional<size_t>> layer(spec.size());
  for (size_t i = 0; i < spec.size(); ++i)
    if (spec[i].layer >= 0) layer[i] = ordinal.emplace(spec[i].layer, ordinal.size()).first->second;
  if (int64_t(ordinal.size()) < f)
    throw Error(fmt::format("[outer] fragments = {}: the model has {} layer(s); a fragment holds "
                            "at least one",
                            f, ordinal.size()),
                "set [outer] fragments to at most the number of layers");
  std::vector<int64_t> size(size_t(f), 0);
  std::vector<size_t> rest;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (!layer[i]) {
      rest.push_back(i);
      continue;
    }
    const size_t p = *layer[i] % size_t(f);
    out[p].push_back(i);
    size[p] += numel(spec[i].shape);
  }
  // largest first, each to the lightest fragment (ties: the lowest)
  std::stable_sort(rest.begin(), rest.end(),
                   [&](size_t a, size_t b) { return numel(spec[a].shape) > numel(spec[b].shape); });
  for (size_t i : rest) {
    const size_t p = size_t(std::min_element(size.begin(), size.end()) - size.begin());
    out[p].push_back(i);
    size[p] += numel(spec[i].shape);
  }
  for (auto& p : out) std::sort(p.begin(), p.end());
  return out;
}

}  // namespace loom::outer
