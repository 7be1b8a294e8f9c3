#include "kernels/cuda/activation.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;

// The CPU uses Cephes-style vector exp/tanh (1-2 ulp), the GPU CUDA's expf/tanhf (<= 2 ulp): the
// products agree to a few ulps, so 1e-5 relative plus 1e-6 absolute.
constexpr double kRel = 1e-5, kAbs = 1e-6;

TEST(CudaActivation, GatedActivationsMatchCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t n = 10007;
  const auto gate = kimi::testing::RandomVector(n, 1, -30.0f, 30.0f);
  const auto up = kimi::testing::RandomVector(n, 2, -60.0f, 60.0f);
  std::vector<float> silu(n), situ(n), sig(n), mul = up;
  kimi::cpu::SiluGlu(silu.data(), gate.data(), up.data(), n);
  kimi::cpu::SituGlu(situ.data(), gate.data(), up.data(), n, 4.0f, 25.0f);
  sig = gate;
  kimi::cpu::SigmoidInPlace(sig.data(), n);
  kimi::cpu::MulSigmoid(mul.data(), gate.data(), n);
  DeviceVector<float> dg(gate), du(up), d1(n), d2(n), d3(n), d4(up);
  ASSERT_TRUE(SiluGlu(d1.get(), dg.get(), du.get(), n, nullptr).ok());
  ASSERT_TRUE(SituGlu(d2.get(), dg.get(), du.get(), n, 4.0f, 25.0f, nullptr).ok());
  ASSERT_TRUE(Sigmoid(d3.get(), dg.get(), n, nullptr).ok());
  ASSERT_TRUE(MulSigmoid(d4.get(), dg.get(), n, nullptr).ok());
  testing::Sync();
  EXPECT_LE(testing::WorstRatio(d1.Host(), silu, {}, kAbs, kRel), 1.0) << "silu";
  EXPECT_LE(testing::WorstRatio(d2.Host(), situ, {}, kAbs, kRel), 1.0) << "situ";
  EXPECT_LE(testing::WorstRatio(d3.Host(), sig, {}, kAbs, kRel), 1.0) << "sigmoid";
  EXPECT_LE(testing::WorstRatio(d4.Host(), mul, {}, kAbs, kRel), 1.0) << "mul sigmoid";
}

TEST(CudaElementwise, AddCopyRowsAndBf16Split) {
  KIMI_REQUIRE_GPU();
  const int64_t rows = 9, cols = 70, ld = 80;
  const auto x = kimi::testing::RandomVector(rows * ld, 3, -100.0f, 100.0f);
  const auto y = kimi::testing::RandomVector(rows * ld, 4);
  DeviceVector<float> dx(x), dy(y), dc(rows * cols);
  DeviceVector<int32_t> idx(std::vector<int32_t>{8, 0, -1, 3, 3, 1, 2, 7, 5});
  DeviceVector<uint16_t> hi(rows * cols), lo(rows * cols);
  ASSERT_TRUE(AddInPlace(dy.get(), dx.get(), rows * ld, nullptr).ok());
  ASSERT_TRUE(CopyRows(dc.get(), cols, dx.get(), ld, idx.get(), rows, cols, nullptr).ok());
  ASSERT_TRUE(SplitToBf16(hi.get(), lo.get(), dx.get(), ld, rows, cols, nullptr).ok());
  testing::Sync();
  const auto sum = dy.Host(), copy = dc.Host();
  const auto h = hi.Host(), l = lo.Host();
  const int32_t index[] = {8, 0, -1, 3, 3, 1, 2, 7, 5};
  for (int64_t i = 0; i < rows * ld; ++i) EXPECT_EQ(sum[i], y[i] + x[i]);  // one fp32 add: exact
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(copy[r * cols + c], index[r] < 0 ? 0.0f : x[index[r] * ld + c]);
      const float v = x[r * ld + c];
      EXPECT_EQ(h[r * cols + c], F32ToBf16(v));  // round to nearest even, as the CPU converts
      const double err = std::fabs(Bf16ToF32(h[r * cols + c]) + Bf16ToF32(l[r * cols + c]) - v);
      EXPECT_LE(err, std::fabs(v) * std::ldexp(1.0, -16)) << v;  // hi + lo: ~2^-17 relative
    }
  }
}

}  // namespace
}  // namespace kimi::cuda
