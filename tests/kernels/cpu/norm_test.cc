#include "kernels/cpu/norm.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

TEST(Norm, RmsNormMatchesDefinition) {
  const int64_t rows = 5, dim = 300;
  const auto x = testing::RandomVector(rows * dim, 1, -3.0f, 3.0f);
  const auto w = testing::RandomVector(dim, 2, 0.5f, 1.5f);
  std::vector<float> out(rows * dim);
  RmsNorm(out.data(), x.data(), w.data(), rows, dim, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(x[r * dim + j]) * x[r * dim + j];
    const double rstd = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t j = 0; j < dim; ++j) {
      const double want = x[r * dim + j] * rstd * w[j];
      EXPECT_NEAR(out[r * dim + j], want, 1e-6 * (1 + std::fabs(want)));
    }
  }
  // In place and without a weight.
  std::vector<float> y = x;
  RmsNorm(y.data(), y.data(), nullptr, rows, dim, 1e-5f);
  RmsNorm(out.data(), x.data(), nullptr, rows, dim, 1e-5f);
  EXPECT_EQ(y, out);
}

TEST(Norm, L2NormHasEpsInsideTheRootOnTheSum) {
  std::vector<float> x = {3.0f, 4.0f, 0.0f, 0.0f, 1e-4f, 0.0f};
  L2Norm(x.data(), 3, 2, 1e-6f);
  EXPECT_NEAR(x[0], 3.0 / std::sqrt(25.0 + 1e-6), 1e-7);
  EXPECT_NEAR(x[1], 4.0 / std::sqrt(25.0 + 1e-6), 1e-7);
  EXPECT_EQ(x[2], 0.0f);  // zero vector stays zero, no NaN
  EXPECT_NEAR(x[4], 1e-4 / std::sqrt(1e-8 + 1e-6), 1e-6);
}

}  // namespace
}  // namespace kimi::cpu
