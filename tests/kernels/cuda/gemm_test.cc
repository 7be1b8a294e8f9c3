// The GEMMs: WeightGemm (weights in any stored format, dequantised in the kernel) and the cuBLASLt
// wrapper, against kernels/cpu MatMul.
#include "kernels/cuda/gemm.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/weight_gemm.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;
using kimi::testing::RandomVector;

// A random weight in `format` with host bytes and a device copy.
struct TestWeight {
  std::vector<uint8_t> data, scales;
  Weight host;
  std::unique_ptr<DeviceVector<uint8_t>> ddata, dscales;
  Weight dev;
};

std::unique_ptr<TestWeight> MakeWeight(WeightFormat f, int64_t n, int64_t k, uint32_t seed) {
  auto w = std::make_unique<TestWeight>();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  w->host.format = f;
  w->host.rows = n;
  w->host.cols = k;
  switch (f) {
    case WeightFormat::kF32:
      w->data.resize(n * k * 4);
      for (int64_t i = 0; i < n * k; ++i) {
        const float v = u(rng);
        std::memcpy(&w->data[i * 4], &v, 4);
      }
      break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      w->data.resize(n * k * 2);
      for (int64_t i = 0; i < n * k; ++i) {
        const uint16_t h = f == WeightFormat::kBF16 ? F32ToBf16(u(rng)) : F32ToF16(u(rng));
        std::memcpy(&w->data[i * 2], &h, 2);
      }
      break;
    case WeightFormat::kMxfp4:
      w->data.resize(n * k / 2);
      w->scales.resize(n * k / 32);
      for (auto& b : w->data) b = static_cast<uint8_t>(rng());
      for (auto& s : w->scales) s = static_cast<uint8_t>(124 + rng() % 5);
      break;
  }
  w->host.data = w->data.data();
  w->host.scales = w->scales.empty() ? nullptr : w->scales.data();
  w->ddata = std::make_unique<DeviceVector<uint8_t>>(w->data);
  w->dev = w->host;
  w->dev.data = w->ddata->get();
  if (!w->scales.empty()) {
    w->dscales = std::make_unique<DeviceVector<uint8_t>>(w->scales);
    w->dev.scales = w->dscales->get();
  }
  return w;
}

// sum_k |x[i, k] w[n, k]| for every output: the scale of the rounding error of a dot product.
std::vector<float> AbsSums(const std::vector<float>& x, const Weight& w, int64_t m) {
  std::vector<float> s(m * w.rows), row(w.cols);
  for (int64_t n = 0; n < w.rows; ++n) {
    kimi::cpu::DequantizeRow(row.data(), w, n);
    for (int64_t i = 0; i < m; ++i) {
      double a = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) a += std::fabs(static_cast<double>(x[i * w.cols + c]) * row[c]);
      s[i * w.rows + n] = static_cast<float>(a);
    }
  }
  return s;
}

// fp32 accumulation in another order than the CPU's 16 lanes: 1e-5 of sum |x w| per output.
TEST(CudaWeightGemm, EveryFormatMatchesCpu) {
  KIMI_REQUIRE_GPU();
  for (const WeightFormat f :
       {WeightFormat::kF32, WeightFormat::kF16, WeightFormat::kBF16, WeightFormat::kMxfp4}) {
    const int64_t n = 100, k = f == WeightFormat::kMxfp4 ? 96 : 70;
    auto w = MakeWeight(f, n, k, 1);
    for (const int64_t m : {1, 17, 40}) {
      const auto x = RandomVector(m * k, 2);
      std::vector<float> want(m * n);
      kimi::cpu::MatMul(want.data(), x.data(), w->host, m);
      DeviceVector<float> dx(x), dy(m * n);
      ASSERT_TRUE(WeightGemm(dy.get(), n, dx.get(), k, w->dev, m, nullptr).ok());
      testing::Sync();
      EXPECT_LE(testing::WorstRatio(dy.Host(), want, AbsSums(x, w->host, m), 1e-6, 1e-5), 1.0)
          << static_cast<int>(f) << " m=" << m;
    }
  }
}

// A row's result is the same alone or among other rows (bitwise).
TEST(CudaWeightGemm, RowsAreBatchInvariant) {
  KIMI_REQUIRE_GPU();
  const int64_t n = 130, k = 64, m = 37;
  auto w = MakeWeight(WeightFormat::kMxfp4, n, k, 3);
  const auto x = RandomVector(m * k, 4);
  DeviceVector<float> dx(x), all(m * n), one(n);
  ASSERT_TRUE(WeightGemm(all.get(), n, dx.get(), k, w->dev, m, nullptr).ok());
  ASSERT_TRUE(WeightGemm(one.get(), n, dx.get() + 20 * k, k, w->dev, 1, nullptr).ok());
  testing::Sync();
  const auto a = all.Host(), o = one.Host();
  for (int64_t c = 0; c < n; ++c) ASSERT_EQ(a[20 * n + c], o[c]) << c;
}

// Per-head slices (MLA's absorbed W_UK and W_UV): problem b uses weight rows [b * stride, + n).
TEST(CudaWeightGemm, BatchedMatchesCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t heads = 3, n = 40, stride = 56, k = 64, m = 5;
  auto w = MakeWeight(WeightFormat::kBF16, heads * stride, k, 5);
  const auto x = RandomVector(m * heads * k, 6);  // [m, heads, k]
  std::vector<float> want(m * heads * n);
  for (int64_t h = 0; h < heads; ++h) {
    kimi::cpu::MatMul(want.data() + h * n, heads * n, x.data() + h * k, heads * k,
                      w->host.Rows(h * stride, n), m);
  }
  DeviceVector<float> dx(x), dy(m * heads * n);
  ASSERT_TRUE(WeightGemmBatched(dy.get(), heads * n, n, dx.get(), heads * k, k, w->dev, n, stride, m,
                                heads, nullptr)
                  .ok());
  testing::Sync();
  EXPECT_LE(testing::WorstRatio(dy.Host(), want, {}, 1e-5, 1e-5), 1.0);
}

// cuBLASLt, bf16 weights. kSplit carries x as bf16 hi + lo (~2^-17 relative), so 2e-5 of
// sum |x w| against the CPU's fp32 activations; kBf16 rounds x once, so it is compared with the
// CPU on bf16-rounded x at 1e-5.
TEST(CudaGemm, LinearMatchesCpuInBothPrecisions) {
  KIMI_REQUIRE_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int64_t n = 200, k = 256;
  auto w = MakeWeight(WeightFormat::kBF16, n, k, 7);
  ASSERT_TRUE((*gemm)->Reserve(70 * k).ok());
  for (const int64_t m : {1, 8, 70}) {
    const auto x = RandomVector(m * k, 8, -2.0f, 2.0f);
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) xr[i] = Bf16ToF32(F32ToBf16(x[i]));
    std::vector<float> want(m * n), want_r(m * n);
    kimi::cpu::MatMul(want.data(), x.data(), w->host, m);
    kimi::cpu::MatMul(want_r.data(), xr.data(), w->host, m);
    DeviceVector<float> dx(x), y1(m * n), y2(m * n);
    ASSERT_TRUE((*gemm)->Linear(y1.get(), n, dx.get(), k, w->dev, m, GemmPrecision::kSplit, nullptr).ok());
    ASSERT_TRUE((*gemm)->Linear(y2.get(), n, dx.get(), k, w->dev, m, GemmPrecision::kBf16, nullptr).ok());
    testing::Sync();
    EXPECT_LE(testing::WorstRatio(y1.Host(), want, AbsSums(x, w->host, m), 1e-6, 2e-5), 1.0) << m;
    EXPECT_LE(testing::WorstRatio(y2.Host(), want_r, AbsSums(xr, w->host, m), 1e-6, 1e-5), 1.0) << m;
  }
}

// With batch_invariant (the default) one algorithm serves every m: a row alone equals the same
// row inside a batch of 64, bit for bit.
TEST(CudaGemm, BatchInvariantRows) {
  KIMI_REQUIRE_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int64_t n = 512, k = 384, m = 64;
  auto w = MakeWeight(WeightFormat::kBF16, n, k, 9);
  ASSERT_TRUE((*gemm)->Reserve(m * k).ok());
  const auto x = RandomVector(m * k, 10);
  DeviceVector<float> dx(x), all(m * n), one(n);
  ASSERT_TRUE((*gemm)->Linear(all.get(), n, dx.get(), k, w->dev, m, GemmPrecision::kSplit, nullptr).ok());
  ASSERT_TRUE((*gemm)->Linear(one.get(), n, dx.get() + 33 * k, k, w->dev, 1, GemmPrecision::kSplit, nullptr).ok());
  testing::Sync();
  const auto a = all.Host(), o = one.Host();
  for (int64_t c = 0; c < n; ++c) ASSERT_EQ(a[33 * n + c], o[c]) << c;
}

TEST(CudaGemm, ShortReservationIsAnErrorAndOtherFormatsFallBack) {
  KIMI_REQUIRE_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  auto bf = MakeWeight(WeightFormat::kBF16, 16, 64, 11);
  auto f32 = MakeWeight(WeightFormat::kF32, 16, 64, 12);
  const auto x = RandomVector(4 * 64, 13);
  DeviceVector<float> dx(x), dy(4 * 16);
  const absl::Status short_room = (*gemm)->Linear(dy.get(), 16, dx.get(), 64, bf->dev, 4,
                                                  GemmPrecision::kSplit, nullptr);
  EXPECT_EQ(short_room.code(), absl::StatusCode::kFailedPrecondition) << short_room;
  ASSERT_TRUE((*gemm)->Linear(dy.get(), 16, dx.get(), 64, f32->dev, 4, GemmPrecision::kSplit, nullptr).ok());
  testing::Sync();
  std::vector<float> want(4 * 16);
  kimi::cpu::MatMul(want.data(), x.data(), f32->host, 4);
  EXPECT_LE(testing::WorstRatio(dy.Host(), want, AbsSums(x, f32->host, 4), 1e-6, 1e-5), 1.0);
}

}  // namespace
}  // namespace kimi::cuda
