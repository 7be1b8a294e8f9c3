#include "kernels/cpu/attn_res.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

// Softmax over depth of RMS-normalised rows scored by the pseudo-query; raw rows mixed.
TEST(AttnRes, MatchesDefinition) {
  const int64_t T = 3, NB = 4, H = 40, stride = 6 * H;  // bank rows beyond NB are ignored
  const auto bank = testing::RandomVector(T * stride, 1, -2.0f, 2.0f);
  const auto partial = testing::RandomVector(T * H, 2, -2.0f, 2.0f);
  const auto w = testing::RandomVector(H, 3);
  std::vector<float> out(T * H), probs(T * (NB + 1));
  AttnRes(out.data(), probs.data(), bank.data(), stride, NB, partial.data(), w.data(), T, H, 1e-5f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<const float*> rows;
    for (int64_t j = 0; j < NB; ++j) rows.push_back(&bank[t * stride + j * H]);
    rows.push_back(&partial[t * H]);
    std::vector<double> s;
    double mx = -1e300;
    for (const float* r : rows) {
      double ss = 0.0, dot = 0.0;
      for (int64_t i = 0; i < H; ++i) {
        ss += static_cast<double>(r[i]) * r[i];
        dot += static_cast<double>(r[i]) * w[i];
      }
      s.push_back(dot / std::sqrt(ss / H + 1e-5));
      mx = std::max(mx, s.back());
    }
    double den = 0.0;
    for (double& v : s) den += (v = std::exp(v - mx));
    for (int64_t j = 0; j <= NB; ++j) EXPECT_NEAR(probs[t * (NB + 1) + j], s[j] / den, 1e-6);
    for (int64_t i = 0; i < H; ++i) {
      double want = 0.0;
      for (int64_t j = 0; j <= NB; ++j) want += s[j] / den * rows[j][i];
      EXPECT_NEAR(out[t * H + i], want, 1e-5);
    }
  }
}

}  // namespace
}  // namespace kimi::cpu
