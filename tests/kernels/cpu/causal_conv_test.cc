#include "kernels/cpu/causal_conv.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

// y[t,c] = silu(sum_j w[c,j] x[t-3+j, c]) with zeros before the start; feeding the sequence in
// pieces (state carried) equals feeding it whole.
TEST(CausalConv, DefinitionAndStreaming) {
  const int64_t T = 11, C = 5;
  const int W = 4;
  const auto x = testing::RandomVector(T * C, 1);
  const auto w = testing::RandomVector(C * W, 2);
  std::vector<float> y(T * C), state((W - 1) * C, 0.0f);
  CausalConv1dSilu(y.data(), C, x.data(), C, T, C, w.data(), W, state.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int j = 0; j < W; ++j) {
        const int64_t src = t - (W - 1) + j;
        if (src >= 0) acc += static_cast<double>(w[c * W + j]) * x[src * C + c];
      }
      EXPECT_NEAR(y[t * C + c], Silu(acc), 1e-6);
    }
  }
  // The final state holds the last W-1 inputs, oldest first.
  for (int r = 0; r < W - 1; ++r) {
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(state[r * C + c], x[(T - (W - 1) + r) * C + c]);
  }
  std::vector<float> y2(T * C), s2((W - 1) * C, 0.0f);
  int64_t t0 = 0;
  for (int64_t n : {1, 1, 4, 2, 3}) {
    CausalConv1dSilu(y2.data() + t0 * C, C, x.data() + t0 * C, C, n, C, w.data(), W, s2.data());
    t0 += n;
  }
  EXPECT_EQ(y, y2);
  EXPECT_EQ(state, s2);
}

}  // namespace
}  // namespace kimi::cpu
