#include "loom/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace loom::train {

double Schedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * double(step) / double(warmup);
  if (total <= warmup) return lr;
  double progress = std::clamp(double(step - 1 - warmup) / double(total - warmup), 0.0, 1.0);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace loom::train
