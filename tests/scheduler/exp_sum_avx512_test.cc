#include "scheduler/exp_sum_avx512.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "scheduler/sampling.h"

namespace kimi::sched {
namespace {

bool HasAvx512() { return cpu::HasAvx512(cpu::MatMulIsa()); }

double Reference(const std::vector<float>& x, float top) {
  double sum = 0.0;
  for (float v : x) sum += std::exp(double{v} - top);
  return sum;
}

// Against the sum in double of libm's exps, over every tail length (0-300 values: the 128-value
// steps, the 16-lane tail and its mask) and 100k-value rows, spreads from 0.3 to 30 (so from
// every exp near 1 to most far below the largest). Tolerance 5e-7 relative: on these rows the
// sum's mass lies within a few units of the top, where each exp is within 1.2e-7 (the polynomial's
// 8e-8 in float, t's rounding); the float tree of eight adds three roundings (1.8e-7); the widened
// sums are exact to 1e-16 (measured: under 1e-7). A flat row (100,000 values at -6.2266 below one
// at the top: the mass far below it) has t = -8.98 rounded to float, 2^-24 of it, 3.7e-7 relative
// in each exp, on top of the same 3e-7: tolerance 1e-6 (a reviewer measured 4.3e-7).
TEST(ExpSumAvx512, MatchesTheSumOfExpsInDouble) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(9);
  double worst = 0.0;
  for (const float spread : {0.3f, 3.0f, 30.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<size_t> sizes;
    for (size_t n = 0; n <= 300; ++n) sizes.push_back(n);
    sizes.push_back(100000);
    sizes.push_back(100512);
    for (const size_t n : sizes) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      const float top = n ? *std::max_element(x.begin(), x.end()) : 0.0f;
      const double want = Reference(x, top);
      const double got = ExpSumAvx512(x.data(), n, top, nullptr, 0);
      if (n == 0) {
        EXPECT_EQ(got, 0.0);
        continue;
      }
      worst = std::max(worst, std::abs(got / want - 1.0));
      ASSERT_NEAR(got / want, 1.0, 5e-7) << "n " << n << " spread " << spread;
    }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::vector<float> flat(100001, -0x1.8e80acp+2f);
  flat[0] = 0.0f;
  EXPECT_NEAR(ExpSumAvx512(flat.data(), flat.size(), 0.0f, nullptr, 0) / Reference(flat, 0.0f), 1.0,
              1e-6);
}

// -inf and values far below the top add (almost) nothing, a NaN makes the sum NaN, the top itself
// adds exactly 1, and the next row's prefetch changes nothing.
TEST(ExpSumAvx512, SpecialValues) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512";
  for (const size_t n : {size_t{5}, size_t{200}}) {
    std::vector<float> x(n, -INFINITY);
    x[n / 2] = 2.0f;
    x[n - 1] = -1e30f;
    EXPECT_NEAR(ExpSumAvx512(x.data(), n, 2.0f, nullptr, 0), 1.0, 1e-30 * static_cast<double>(n));
    std::vector<float> next(300, 1.0f);
    EXPECT_EQ(ExpSumAvx512(x.data(), n, 2.0f, next.data(), next.size()),
              ExpSumAvx512(x.data(), n, 2.0f, nullptr, 0));
    x[0] = std::nanf("");
    EXPECT_TRUE(std::isnan(ExpSumAvx512(x.data(), n, 2.0f, nullptr, 0)));
  }
}

// The logprobs through the AVX-512 normaliser agree with the portable loop's (the kernels' AVX2
// level), and the tokens are the same (the draw never uses the normaliser).
TEST(ExpSumAvx512, LogprobsAgreeWithThePortableLoop) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512";
  const cpu::Isa isa = cpu::MatMulIsa();
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(100512);
  for (float& v : row) v = normal(rng);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.want_logprobs = true;
  p.logprobs = 5;
  std::vector<TokenChoice> fast;
  for (uint64_t i = 0; i < 20; ++i) fast.push_back(SampleToken(row, p, {}, {}, i));
  ASSERT_TRUE(cpu::SetMatMulIsa(cpu::Isa::kAvx2));
  for (uint64_t i = 0; i < 20; ++i) {
    const TokenChoice portable = SampleToken(row, p, {}, {}, i);
    EXPECT_EQ(fast[i].token, portable.token);
    EXPECT_NEAR(fast[i].logprob, portable.logprob, 1e-5);
    ASSERT_EQ(fast[i].top.size(), portable.top.size());
    for (size_t k = 0; k < portable.top.size(); ++k) {
      EXPECT_EQ(fast[i].top[k].first, portable.top[k].first);
      EXPECT_NEAR(fast[i].top[k].second, portable.top[k].second, 1e-5);
    }
  }
  cpu::SetMatMulIsa(isa);
}

}  // namespace
}  // namespace kimi::sched
