#include "loom/train/schedule.h"

#include <gtest/gtest.h>

namespace loom::train {
namespace {

TEST(Schedule, WarmupThenCosineThenFloor) {
  Schedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .total = 110};
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(11), 1e-3);
  EXPECT_NEAR(s.at(61), 5.5e-4, 1e-15);
  EXPECT_GT(s.at(110), 1e-4);  // the last step still updates
  EXPECT_NEAR(s.at(110), 1.0022e-4, 1e-8);
  EXPECT_DOUBLE_EQ(s.at(111), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  for (int64_t t = 11; t < 111; ++t) EXPECT_LT(s.at(t + 1), s.at(t)) << t;
}

// One step, min_lr 0: the step trains at lr (it trained at 0, a run that changed nothing).
TEST(Schedule, ARunOfOneStepUpdates) {
  Schedule s{.lr = 1e-3, .min_lr = 0, .warmup = 0, .total = 1};
  EXPECT_DOUBLE_EQ(s.at(1), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(2), 0);
}

TEST(Schedule, ConstantWithoutDecay) {
  Schedule s{.lr = 2e-4};
  EXPECT_DOUBLE_EQ(s.at(1), 2e-4);
  EXPECT_DOUBLE_EQ(s.at(1000), 2e-4);
}

}  // namespace
}  // namespace loom::train
