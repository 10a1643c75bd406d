#include "loom/train/tensor_list.h"

#include "loom/core/error.h"
#include "loom/core/shape.h"

namespace loom::train {

TensorList zeros_like(const TensorList& t) {
  TensorList out;
  out.reserve(t.size());
  for (const auto& x : t)
    out.push_back({x.name, x.shape, std::vector<float>(size_t(numel(x.shape))), x.layer});
  return out;
}

int64_t total_elements(const TensorList& t) {
  int64_t n = 0;
  for (const auto& x : t) n += int64_t(x.data.size());
  return n;
}

TensorList gather(const TensorList& all, const std::vector<size_t>& which) {
  TensorList out;
  out.reserve(which.size());
  for (size_t i : which) out.push_back(all[i]);
  return out;
}

void scatter(const TensorList& part, const std::vector<size_t>& which, TensorList& all) {
  LOOM_CHECK(part.size() == which.size()) << "a fragment of " << which.size() << " tensors";
  for (size_t k = 0; k < which.size(); ++k) all[which[k]].data = part[k].data;
}

}  // namespace loom::train
