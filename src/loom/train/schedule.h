// Learning-rate schedule: linear warmup from 0 to `lr` over `warmup` steps, then cosine decay
// toward `min_lr`, reached just after step `total` (as torchtitan's and PyTorch's schedules, whose
// last update still has a rate: at `total` itself min_lr would make the last step, and a run of
// one step, update nothing), constant after. Steps count from 1 (the first update uses lr(1)).
//
// Example: lr = 1e-3, warmup = 10, total = 110, min_lr = 1e-4: lr(5) = 5e-4, lr(10) = lr(11) =
// 1e-3, lr(61) = 1e-4 + 0.5 * 9e-4 * (1 + cos(pi/2)) = 5.5e-4, lr(110) = 1e-4 + 4.5e-4 * (1 +
// cos(0.99 pi)) = 1.0022e-4, lr(111) = lr(500) = 1e-4.
#pragma once

#include <cstdint>

namespace loom::train {

struct Schedule {
  double lr = 3e-4, min_lr = 0;
  int64_t warmup = 0, total = 0;  // total <= warmup: constant lr after warmup

  double at(int64_t step) const;
};

}  // namespace loom::train
