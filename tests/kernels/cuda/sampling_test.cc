#include "kernels/cuda/sampling.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/sampling.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;

TEST(CudaSampling, CounterBasedUniformIsTheSchedulers) {
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
    for (uint64_t index : {0ull, 1ull, 12345ull}) {
      EXPECT_EQ(UniformAtHost(seed, index), sched::UniformAt(seed, index));
    }
  }
}

// Against the scheduler's SampleToken (no penalties). The draw compares u with cumulative sums
// that are added in another order on the GPU (differences ~1e-15 relative), so the chosen token
// is the same unless u falls within that distance of a boundary -- never for these seeds. The
// logprob is a float rounding of the same double computation: 1e-5.
TEST(CudaSampling, MatchesSchedulerSampling) {
  KIMI_REQUIRE_GPU();
  for (const int64_t V : {1000, 5000}) {
    std::mt19937 rng(static_cast<uint32_t>(V));
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<sched::SamplingParams> ps;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      sched::SamplingParams p;
      p.seed = seed;
      ps.push_back(p);                  // plain temperature 1
      p.temperature = 0.0f;
      ps.push_back(p);                  // greedy
      p.temperature = 0.7f;
      p.top_k = 40;
      ps.push_back(p);                  // top-k
      p.top_k = 0;
      p.top_p = 0.9f;
      ps.push_back(p);                  // top-p
      p.top_p = 1.0f;
      p.min_p = 0.05f;
      ps.push_back(p);                  // min-p
      p.top_k = 2000;
      p.top_p = 0.8f;
      ps.push_back(p);                  // all three, top-k beyond the candidates
    }
    const int64_t rows = static_cast<int64_t>(ps.size());
    std::vector<float> logits(rows * V);
    for (float& l : logits) l = nd(rng);
    std::vector<SampleParams> dp(rows);
    for (int64_t r = 0; r < rows; ++r) {
      dp[r].temperature = ps[r].temperature;
      dp[r].top_k = ps[r].top_k;
      dp[r].top_p = ps[r].top_p;
      dp[r].min_p = ps[r].min_p;
      dp[r].seed = ps[r].seed;
      dp[r].index = static_cast<uint64_t>(r);
    }
    DeviceVector<float> dl(logits), dlp(rows);
    DeviceVector<SampleParams> dparams(dp);
    DeviceVector<int32_t> dt(rows), dh(rows);
    ASSERT_TRUE(SampleRows(dt.get(), dlp.get(), dh.get(), dl.get(), dparams.get(), rows, V, nullptr).ok());
    testing::Sync();
    const auto tokens = dt.Host(), host = dh.Host();
    const auto lp = dlp.Host();
    for (int64_t r = 0; r < rows; ++r) {
      sched::SamplingParams p = ps[r];
      p.want_logprobs = true;
      const sched::TokenChoice want = sched::SampleToken(
          std::span<const float>(&logits[r * V], V), p, {}, {}, static_cast<uint64_t>(r));
      ASSERT_EQ(host[r], 0) << r;
      EXPECT_EQ(tokens[r], want.token) << "row " << r << " V " << V;
      EXPECT_NEAR(lp[r], want.logprob, 1e-5) << r;
    }
  }
}

// A flat row under top-p 0.99 needs ~99% of the vocabulary sorted: beyond the device's
// candidates, so the row is handed back to the host.
TEST(CudaSampling, FlagsRowsBeyondTheCandidates) {
  KIMI_REQUIRE_GPU();
  const int64_t V = 5000;
  std::vector<float> logits(V, 0.0f);
  SampleParams p;
  p.top_p = 0.99f;
  DeviceVector<float> dl(logits);
  DeviceVector<SampleParams> dp(std::vector<SampleParams>{p});
  DeviceVector<int32_t> dt(1), dh(1);
  ASSERT_TRUE(SampleRows(dt.get(), nullptr, dh.get(), dl.get(), dp.get(), 1, V, nullptr).ok());
  testing::Sync();
  EXPECT_EQ(dh.Host()[0], 1);
}

}  // namespace
}  // namespace kimi::cuda
