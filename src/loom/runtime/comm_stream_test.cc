#include "loom/runtime/comm_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::runtime {
namespace {

TEST(CommStream, RunsTasksInSubmissionOrderOffTheCallingThread) {
  CommStream s;
  std::vector<int> order;
  std::thread::id ran_on;
  for (int i = 0; i < 50; ++i)
    s.submit([&, i] {
      order.push_back(i);
      ran_on = std::this_thread::get_id();
    });
  s.drain();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[size_t(i)], i);
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(s.idle());
}

TEST(CommStream, WaitReturnsOnceItsTaskAndEveryEarlierOneRan) {
  CommStream s;
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  const int64_t first = s.submit([&] {
    while (!release) std::this_thread::yield();
    ++ran;
  });
  const int64_t second = s.submit([&] { ++ran; });
  EXPECT_EQ(second, first + 1);
  EXPECT_FALSE(s.idle());  // the first task is held
  release = true;
  s.wait(second);
  EXPECT_EQ(ran.load(), 2);
}

// The stream's thread waits politely (sleeping between polls) while the caller computes, and is
// hurried (polls flat out) while the caller is blocked in wait(): communicator.h.
TEST(CommStream, ItsThreadIsHurriedOnlyWhileTheCallerIsBlockedInWait) {
  CommStream s;
  std::atomic<bool> checked{false}, seen_hurried{false};
  bool polite = false, hurried_before = true;
  s.submit([&] {
    polite = comm::polite_waits();
    hurried_before = comm::hurried();  // the caller is not waiting yet
    checked = true;
    // then the caller blocks in wait(): bounded, so a missing hurry fails rather than hangs
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!comm::hurried() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    seen_hurried = comm::hurried();
  });
  while (!checked) std::this_thread::yield();
  s.drain();
  EXPECT_TRUE(polite);
  EXPECT_FALSE(hurried_before);
  EXPECT_TRUE(seen_hurried);
  bool hurried_after = true;  // nobody waits any more
  s.submit([&] { hurried_after = comm::hurried(); });
  while (!s.idle()) std::this_thread::yield();
  EXPECT_FALSE(hurried_after);
  EXPECT_FALSE(comm::hurried());  // a thread without a stream never is
}

TEST(CommStream, AFailureIsRethrownByEveryLaterWaitAndDropsWhatFollows) {
  CommStream s;
  bool later_ran = false;
  s.submit([] {});
  const int64_t bad = s.submit([] { throw std::runtime_error("peer 1 aborted"); });
  const int64_t after = s.submit([&] { later_ran = true; });
  EXPECT_THROW(s.wait(bad), std::runtime_error);
  try {
    s.wait(after);
    FAIL() << "the failure is sticky";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "peer 1 aborted");
  }
  EXPECT_FALSE(later_ran);
  EXPECT_TRUE(s.idle());
}

}  // namespace
}  // namespace loom::runtime
