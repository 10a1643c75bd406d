#include "loom/outer/model_tensors.h"

#include <map>

#include "loom/ir/roles.h"

namespace loom::outer {

TensorList model_tensors(train::ParamStore& params, bool with_data) {
  TensorList out;
  std::map<std::string, int64_t> ordinal;  // a repeated layer's block -> its place in forward order
  for (const auto& p : params.infos()) {
    int64_t layer = -1;
    if (ir::ParamGroup{p.block, {}}.layer())
      layer = ordinal.emplace(p.block, int64_t(ordinal.size())).first->second;
    std::vector<float> data;
    if (with_data) {
      const float* d = params.data(p.name);
      data.assign(d, d + numel(p.shape));
    }
    out.push_back({p.name, p.shape, std::move(data), layer});
  }
  return out;
}

}  // namespace loom::outer
