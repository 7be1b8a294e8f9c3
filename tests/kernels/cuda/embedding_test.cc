#include "kernels/cuda/embedding.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;

// A bf16 row converted to fp32 is exact on both sides: equality.
TEST(CudaEmbedding, GathersRowsLikeCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t vocab = 300, d = 96;
  const auto f = kimi::testing::RandomVector(vocab * d, 1);
  std::vector<uint16_t> table(f.size());
  for (size_t i = 0; i < f.size(); ++i) table[i] = F32ToBf16(f[i]);
  const std::vector<int32_t> ids = {5, 299, 0, 5, 128};
  DeviceVector<uint16_t> dt(table);
  DeviceVector<int32_t> di(ids);
  DeviceVector<float> dout(ids.size() * d);
  Weight w;
  w.data = dt.get();
  w.format = WeightFormat::kBF16;
  w.rows = vocab;
  w.cols = d;
  ASSERT_TRUE(EmbeddingGather(dout.get(), w, di.get(), static_cast<int64_t>(ids.size()), nullptr).ok());
  testing::Sync();
  const auto got = dout.Host();
  Weight hw = w;
  hw.data = table.data();
  std::vector<float> row(d);
  for (size_t t = 0; t < ids.size(); ++t) {
    kimi::cpu::DequantizeRow(row.data(), hw, ids[t]);
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got[t * d + i], row[i]) << t << " " << i;
  }
}

}  // namespace
}  // namespace kimi::cuda
