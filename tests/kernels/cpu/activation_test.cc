#include "kernels/cpu/activation.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

TEST(Activation, SiluGlu) {
  const auto g = testing::RandomVector(257, 1, -8.0f, 8.0f);
  const auto u = testing::RandomVector(257, 2, -8.0f, 8.0f);
  std::vector<float> out(257);
  SiluGlu(out.data(), g.data(), u.data(), 257);
  for (int i = 0; i < 257; ++i) {
    const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
  }
}

TEST(Activation, SituGluSoftcapsBothBranches) {
  const auto g = testing::RandomVector(257, 3, -60.0f, 60.0f);
  const auto u = testing::RandomVector(257, 4, -200.0f, 200.0f);
  std::vector<float> out(257);
  SituGlu(out.data(), g.data(), u.data(), 257, 4.0f, 25.0f);
  for (int i = 0; i < 257; ++i) {
    const double gd = g[i], ud = u[i];
    const double want =
        4.0 * std::tanh(gd / 4.0) / (1.0 + std::exp(-gd)) * 25.0 * std::tanh(ud / 25.0);
    EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
    EXPECT_LE(std::fabs(out[i]), 100.0f + 1e-3f);  // |a| < 4, |u| < 25
  }
}

}  // namespace
}  // namespace kimi::cpu
