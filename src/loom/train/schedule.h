// Learning-rate schedule: linear warmup from 0 to `lr` over `warmup` steps, then cosine decay to
// `min_lr` at step `total`, constant after. Steps count from 1 (the first update uses lr(1)).
//
// Example: lr = 1e-3, warmup = 10, total = 110, min_lr = 1e-4: lr(5) = 5e-4, lr(10) = 1e-3,
// lr(60) = 1e-4 + 0.5 * 9e-4 * (1 + cos(pi/2)) = 5.5e-4, lr(110) = lr(500) = 1e-4.
#pragma once

#include <cstdint>

namespace loom::train {

struct Schedule {
  double lr = 3e-4, min_lr = 0;
  int64_t warmup = 0, total = 0;  // total <= warmup: constant lr after warmup

  double at(int64_t step) const;
};

}  // namespace loom::train
