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

// The one-pass form against a row's maxima and the sum in double of libm's exps against its
// largest value: the maxima and the top exactly (a maximum has no rounding), the sum to
// ExpSumAvx512's 5e-7. Rows of every tail length (0-300: the 128-value steps, a last whole run of
// 64, the 16-lane tail), 100k-value rows, and rows whose largest value grows at every step
// (ascending, the sum rescaled 785 times) or only at the end.
TEST(RunMaximaExpSumAvx512, MaximaTopAndSumInOnePass) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(12);
  std::vector<std::vector<float>> rows;
  for (const float spread : {0.3f, 3.0f, 30.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    for (size_t n = 0; n <= 300; ++n) {
      rows.emplace_back(n);
      for (float& v : rows.back()) v = normal(rng);
    }
    rows.emplace_back(100512);
    for (float& v : rows.back()) v = normal(rng);
  }
  std::vector<float> ascending(100512), last(100512);
  for (size_t i = 0; i < ascending.size(); ++i) {
    ascending[i] = -20.0f + 20.0f * static_cast<float>(i) / ascending.size();
    last[i] = std::sin(static_cast<float>(i));
  }
  last.back() = 8.0f;
  rows.push_back(ascending);
  rows.push_back(last);
  for (const std::vector<float>& x : rows) {
    const size_t n = x.size();
    std::vector<float> maxima(n / 64 + 1, 0.0f);
    float top = 0.0f;
    const double sum = RunMaximaExpSumAvx512(x.data(), n, maxima.data(), &top);
    const float want_top = n ? *std::max_element(x.begin(), x.end()) : -INFINITY;
    ASSERT_EQ(top, want_top) << "n " << n;
    for (size_t r = 0; r < n / 64; ++r) {
      ASSERT_EQ(maxima[r], *std::max_element(x.begin() + 64 * r, x.begin() + 64 * r + 64)) << r;
    }
    if (n == 0) {
      EXPECT_EQ(sum, 0.0);
      continue;
    }
    ASSERT_NEAR(sum / Reference(x, top), 1.0, 5e-7) << "n " << n;
  }
}

// NaNs are passed over by the maxima and make the sum NaN, wherever they are (also before any
// number); -inf adds nothing, also before the first number; a row of -inf sums to 0 at top -inf.
TEST(RunMaximaExpSumAvx512, SpecialValues) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512";
  for (const size_t n : {size_t{5}, size_t{200}, size_t{1000}}) {
    std::vector<float> maxima(n / 64 + 1);
    float top = 0.0f;
    std::vector<float> x(n, -INFINITY);
    EXPECT_EQ(RunMaximaExpSumAvx512(x.data(), n, maxima.data(), &top), 0.0);
    EXPECT_EQ(top, -INFINITY);
    x[n - 1] = 2.0f;  // after any whole step of -inf
    x[n / 2] = 1.0f;
    EXPECT_NEAR(RunMaximaExpSumAvx512(x.data(), n, maxima.data(), &top), 1.0 + std::exp(-1.0),
                1e-6);
    EXPECT_EQ(top, 2.0f);
    for (const size_t at : {size_t{0}, n / 2 + 1, n - 2}) {
      std::vector<float> y = x;
      y[at] = std::nanf("");
      EXPECT_TRUE(std::isnan(RunMaximaExpSumAvx512(y.data(), n, maxima.data(), &top))) << at;
      EXPECT_EQ(top, 2.0f) << at;
      if (n >= 64) {
        EXPECT_FALSE(std::isnan(maxima[0])) << at;
      }
    }
  }
}

}  // namespace
}  // namespace kimi::sched
