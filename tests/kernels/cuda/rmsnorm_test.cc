#include "kernels/cuda/rmsnorm.h"

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cuda {
namespace {

// Against the CPU backend. fp32 both sides; the GPU sums in a different order, so 1e-5 relative.
TEST(CudaRmsNorm, MatchesCpu) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no GPU: " << DescribeDevice();
  const int64_t rows = 7, dim = 1000;
  const auto x = kimi::testing::RandomVector(rows * dim, 1, -3.0f, 3.0f);
  const auto w = kimi::testing::RandomVector(dim, 2, 0.5f, 1.5f);
  std::vector<float> want(rows * dim), got(rows * dim);
  kimi::cpu::RmsNorm(want.data(), x.data(), w.data(), rows, dim, 1e-5f);
  float *dx, *dw, *dout;
  ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw, w.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, x.size() * 4), cudaSuccess);
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
  ASSERT_TRUE(RmsNorm(dout, dx, dw, rows, dim, 1e-5f, nullptr));
  cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
}

}  // namespace
}  // namespace kimi::cuda
