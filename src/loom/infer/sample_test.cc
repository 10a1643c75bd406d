// The sampling front door called directly: the sampler's rules, and sample() on a tiny random model
// (every byte accounted for, the cache sliding, a seed fixing the text).
#include "loom/infer/sample.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/infer/sampler.h"
#include "loom/train/params.h"

namespace loom::infer {
namespace {

TEST(Sampler, GreedyTakesTheLargestLogitAndTiesGoToTheLowerId) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f};
  Sampler greedy(0, 0, 1);
  EXPECT_EQ(greedy.next(logits.data(), 4), 1);
  Sampler top1(1.0, 1, 7);  // top_k 1 at any temperature: greedy
  for (int i = 0; i < 10; ++i) EXPECT_EQ(top1.next(logits.data(), 4), 1);
}

TEST(Sampler, TopKDrawsOnlyTheKLikeliestAndASeedFixesTheDraws) {
  const std::vector<float> logits{3.0f, 0.0f, 2.9f, -5.0f, 2.8f};
  Sampler a(10.0, 2, 42), b(10.0, 2, 42);
  std::vector<int> seen(5, 0);
  for (int i = 0; i < 200; ++i) {
    const int x = a.next(logits.data(), 5);
    ++seen[size_t(x)];
    EXPECT_EQ(b.next(logits.data(), 5), x) << "draw " << i;
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_EQ(seen[1] + seen[3] + seen[4], 0);
}

class SampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.cfg = train::load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml");
    m_.config = "tiny-llama";
    m_.weights = (std::filesystem::temp_directory_path() /
                  ("loom_sample_test_" + std::to_string(::getpid()) + ".safetensors"))
                     .string();
    train::ParamStore p(m_.cfg.model);
    p.init_random(5);
    p.save(m_.weights);
  }
  void TearDown() override { std::filesystem::remove(m_.weights); }

  std::string run(const SampleOptions& o, SampleStats* st = nullptr) {
    std::string text;
    const SampleStats s = sample(m_, o, [&](std::string_view b) { text += b; });
    if (st) *st = s;
    return text;
  }
  Model m_;
};

TEST_F(SampleTest, WritesThePromptThenExactlyMaxTokensBytes) {
  SampleStats st;
  const std::string text = run({"Once", 40, 0, 0, 0, 0}, &st);
  ASSERT_EQ(text.size(), 4u + 40u);
  EXPECT_EQ(text.substr(0, 4), "Once");
  EXPECT_EQ(st.prompt_tokens, 4);
  EXPECT_EQ(st.new_tokens, 40);
  EXPECT_EQ(run({"Once", 40, 0, 0, 0, 0}), text);  // greedy: the same text again
}

TEST_F(SampleTest, TheCacheSlidesAndASeedFixesTheText) {
  // context 8: the cache fills and slides several times over 50 tokens
  const SampleOptions o{"ab", 50, 1.0, 0, 3, 8};
  SampleStats st;
  const std::string a = run(o, &st);
  EXPECT_EQ(st.context, 8);
  EXPECT_EQ(a.size(), 52u);
  EXPECT_EQ(run(o), a);
  SampleOptions other = o;
  other.seed = 4;
  EXPECT_NE(run(other), a);
}

TEST(OpenModel, ANonRunIsAnErrorNamingIt) {
  try {
    open_model({"/nonexistent/run", "", "", ""});
    FAIL() << "opened a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/run"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::infer
