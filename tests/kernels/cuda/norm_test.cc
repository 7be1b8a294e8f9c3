#include "kernels/cuda/norm.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;

// fp32 both sides; the GPU reduces the sum of squares in a tree of floats, the CPU in double: the
// normaliser differs by a few ulps, so 1e-5 relative to each output (plus 1e-6 absolute).
constexpr double kRel = 1e-5, kAbs = 1e-6;

TEST(CudaNorm, RmsNormMatchesCpu) {
  KIMI_REQUIRE_GPU();
  for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{7, 1000}, {3, 7168}, {64, 16}}) {
    const auto x = kimi::testing::RandomVector(rows * dim, 1, -3.0f, 3.0f);
    const auto w = kimi::testing::RandomVector(dim, 2, 0.5f, 1.5f);
    std::vector<float> want(rows * dim);
    kimi::cpu::RmsNorm(want.data(), x.data(), w.data(), rows, dim, 1e-5f);
    DeviceVector<float> dx(x), dw(w), dout(rows * dim);
    ASSERT_TRUE(RmsNorm(dout.get(), dx.get(), dw.get(), rows, dim, 1e-5f, nullptr).ok());
    testing::Sync();
    EXPECT_LE(testing::WorstRatio(dout.Host(), want, {}, kAbs, kRel), 1.0) << rows << "x" << dim;
  }
}

TEST(CudaNorm, StridedRmsNormInPlace) {
  KIMI_REQUIRE_GPU();
  const int64_t rows = 5, dim = 512, ld = 576;  // MLA: the latent part of [latent | k_pe] rows
  auto x = kimi::testing::RandomVector(rows * ld, 3);
  const auto w = kimi::testing::RandomVector(dim, 4, 0.5f, 1.5f);
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) kimi::cpu::RmsNorm(&want[r * ld], &x[r * ld], w.data(), 1, dim, 1e-6f);
  DeviceVector<float> dx(x), dw(w);
  ASSERT_TRUE(RmsNorm(dx.get(), ld, dx.get(), ld, dw.get(), rows, dim, 1e-6f, nullptr).ok());
  testing::Sync();
  EXPECT_LE(testing::WorstRatio(dx.Host(), want, {}, kAbs, kRel), 1.0);  // k_pe untouched too
}

TEST(CudaNorm, L2NormAndGatedRmsNormMatchCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t rows = 33, dim = 128;
  const auto x = kimi::testing::RandomVector(rows * dim, 5, -2.0f, 2.0f);
  const auto gate = kimi::testing::RandomVector(rows * dim, 6, -4.0f, 4.0f);
  const auto w = kimi::testing::RandomVector(dim, 7, 0.5f, 1.5f);
  std::vector<float> want_l2 = x, want_gated(rows * dim);
  kimi::cpu::L2Norm(want_l2.data(), rows, dim, 1e-6f);
  kimi::cpu::RmsNorm(want_gated.data(), x.data(), w.data(), rows, dim, 1e-5f);
  kimi::cpu::MulSigmoid(want_gated.data(), gate.data(), rows * dim);
  DeviceVector<float> d1(x), d2(x), dg(gate), dw(w);
  ASSERT_TRUE(L2Norm(d1.get(), rows, dim, 1e-6f, nullptr).ok());
  ASSERT_TRUE(RmsNormGated(d2.get(), dg.get(), dw.get(), rows, dim, 1e-5f, nullptr).ok());
  testing::Sync();
  EXPECT_LE(testing::WorstRatio(d1.Host(), want_l2, {}, kAbs, kRel), 1.0);
  EXPECT_LE(testing::WorstRatio(d2.Host(), want_gated, {}, kAbs, kRel), 1.0);
}

}  // namespace
}  // namespace kimi::cuda
