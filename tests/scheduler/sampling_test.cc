#include "scheduler/sampling.h"

#include <cmath>
#include <map>
#include <numeric>

#include "gtest/gtest.h"

namespace kimi::sched {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f}; }

TEST(Sampling, GreedyTakesTheArgmaxAndReportsRawLogprobs) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 3;
  const auto l = Logits();
  const TokenChoice c = SampleToken(l, p, {}, {}, 0);
  EXPECT_EQ(c.token, 1);
  double z = 0.0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(c.logprob, 3.0 - std::log(z), 1e-6);
  ASSERT_EQ(c.top.size(), 3u);
  EXPECT_EQ(c.top[0].first, 1);
  EXPECT_EQ(c.top[1].first, 5);
  EXPECT_EQ(c.top[2].first, 2);
}

// Draws depend on (seed, index) only; their frequencies follow softmax(l / T).
TEST(Sampling, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  const auto l = Logits();
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t a = SampleToken(l, p, {}, {}, i).token;
    EXPECT_EQ(a, SampleToken(l, p, {}, {}, i).token);
    ++counts[a];
  }
  double z = 0.0;
  for (float v : l) z += std::exp(v / 0.7);
  for (size_t t = 0; t < l.size(); ++t) {
    const double expected = std::exp(l[t] / 0.7) / z;
    const double sd = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(counts[t] / static_cast<double>(n), expected, 5 * sd + 1e-4) << t;
  }
}

TEST(Sampling, FiltersRestrictTheCandidates) {
  const auto l = Logits();
  SamplingParams p;
  p.seed = 1;
  p.temperature = 1.0f;
  p.top_k = 2;  // {1, 5}
  for (int i = 0; i < 200; ++i) {
    const int32_t t = SampleToken(l, p, {}, {}, i).token;
    EXPECT_TRUE(t == 1 || t == 5) << t;
  }
  p.top_k = 0;
  p.top_p = 0.01f;  // only the best
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleToken(l, p, {}, {}, i).token, 1);
  p.top_p = 1.0f;
  p.min_p = 0.6f;  // e^(2.9-3)=0.90 and e^(2.5-3)=0.61 pass; e^(1-3)=0.14 does not
  for (int i = 0; i < 300; ++i) {
    const int32_t t = SampleToken(l, p, {}, {}, i).token;
    EXPECT_TRUE(t == 1 || t == 5 || t == 2) << t;
  }
}

TEST(Sampling, PenaltiesDiscourageRepeats) {
  const auto l = Logits();
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 1.0f;  // 3 - 1 < 2.9
  const std::vector<int32_t> out = {1};
  EXPECT_EQ(SampleToken(l, p, {}, out, 0).token, 5);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.06f;  // 3 - 2*0.06 = 2.88 < 2.9
  const std::vector<int32_t> twice = {1, 1};
  EXPECT_EQ(SampleToken(l, p, {}, twice, 0).token, 5);
  p.frequency_penalty = 0.0f;
  p.repetition_penalty = 1.1f;  // prompt tokens too: 3 / 1.1 = 2.73 < 2.9
  const std::vector<int32_t> prompt = {1};
  EXPECT_EQ(SampleToken(l, p, prompt, {}, 0).token, 5);
}

TEST(Sampling, LargeVocabularyTopP) {
  std::vector<float> l(100000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(i * 0.37) * 2.0);
  SamplingParams p;
  p.seed = 3;
  p.top_p = 0.999f;  // needs more than the first 1024 sorted candidates
  p.min_p = 0.001f;
  const TokenChoice c = SampleToken(l, p, {}, {}, 7);
  EXPECT_GE(c.token, 0);
  EXPECT_EQ(c.token, SampleToken(l, p, {}, {}, 7).token);
}

}  // namespace
}  // namespace kimi::sched
