#include "kernels/cpu/moe_route.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

// The bias chooses, the unbiased scores weigh: a large bias on expert 0 makes it selected while
// its weight stays its own sigmoid score.
TEST(MoeRoute, BiasSelectsButDoesNotWeigh) {
  const std::vector<float> logits = {-4.0f, 1.0f, 2.0f, 0.5f};
  const std::vector<float> bias = {10.0f, 0.0f, 0.0f, 0.0f};
  int32_t ids[2];
  float w[2];
  MoeRouteParams p{4, 2, 1, 1, /*renormalize=*/false, /*scaling=*/2.0f};
  MoeRoute(ids, w, logits.data(), bias.data(), 1, p);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], 2.0 / (1.0 + std::exp(4.0)), 1e-7);
  EXPECT_NEAR(w[1], 2.0 / (1.0 + std::exp(-2.0)), 1e-7);
  p.renormalize = true;
  MoeRoute(ids, w, logits.data(), bias.data(), 1, p);
  EXPECT_NEAR(w[0] + w[1], 2.0, 1e-6);
}

// Grouped top-k against a direct implementation of the DeepSeek-V3 rule.
TEST(MoeRoute, GroupedTopK) {
  const int64_t T = 50, E = 32, G = 4, TG = 2, K = 4;
  const auto logits = testing::RandomVector(T * E, 1, -3.0f, 3.0f);
  const auto bias = testing::RandomVector(E, 2, -0.2f, 0.2f);
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  MoeRoute(ids.data(), w.data(), logits.data(), bias.data(), T,
           MoeRouteParams{E, K, G, TG, true, 1.5f});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E), b(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[t * E + e])));
      b[e] = s[e] + bias[e];
    }
    std::vector<double> gs(G);
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> m(b.begin() + g * (E / G), b.begin() + (g + 1) * (E / G));
      std::sort(m.rbegin(), m.rend());
      gs[g] = m[0] + m[1];
    }
    std::vector<int> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int c) { return gs[a] > gs[c]; });
    std::vector<int> cand;
    for (int64_t e = 0; e < E; ++e) {
      const int g = static_cast<int>(e / (E / G));
      if (g == order[0] || g == order[1]) cand.push_back(static_cast<int>(e));
    }
    std::sort(cand.begin(), cand.end(), [&](int a, int c) { return b[a] > b[c]; });
    double sum = 0.0;
    for (int j = 0; j < K; ++j) sum += s[cand[j]];
    for (int j = 0; j < K; ++j) {
      ASSERT_EQ(ids[t * K + j], cand[j]) << t;
      EXPECT_NEAR(w[t * K + j], s[cand[j]] / sum * 1.5, 1e-6);
    }
  }
}

// The k best experts by biased score against a stable sort of every expert: ties (many, from
// logits drawn from a few values) go to the lower id, and a NaN logit ranks below every number.
TEST(MoeRoute, TiesGoToTheLowerIdAndNanRanksLast) {
  const int64_t T = 40, E = 64, K = 8;
  std::vector<float> logits = testing::RandomVector(T * E, 3, -2.0f, 2.0f);
  for (int64_t i = 0; i < T * E; ++i) logits[i] = std::round(logits[i] * 2.0f) / 2.0f;
  for (int64_t t = 0; t < T; t += 3) logits[t * E + (t * 7) % E] = NAN;
  logits[5 * E + 1] = INFINITY;
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  MoeRoute(ids.data(), w.data(), logits.data(), nullptr, T, MoeRouteParams{E, K, 1, 1, true, 1.0f});
  for (int64_t t = 0; t < T; ++t) {
    auto key = [&](int e) {
      const float s = 1.0f / (1.0f + std::exp(-logits[t * E + e]));
      return std::isnan(s) ? -INFINITY : s;
    };
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
    for (int64_t j = 0; j < K; ++j) ASSERT_EQ(ids[t * K + j], order[j]) << "token " << t;
  }
}

}  // namespace
}  // namespace kimi::cpu
