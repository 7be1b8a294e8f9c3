#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/mla.h"
#include "kernels/cuda/mla_attention.h"
#include "kernels/cuda/mla_cache.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceBatchOf;
using testing::DeviceVector;
using testing::HostSeq;
using kimi::testing::RandomVector;

// A prefill chunk (3 tokens at positions 9..11), a decode token at position 5 and a padding
// sequence, over one paged pool. The cache write is a copy (exact); the attention is fp32 on both
// sides, summed in other orders (the CPU: each score in 16 lanes, 32-key online-softmax steps in
// 128-key chunks folded in order), so 1e-5 absolute plus 1e-5 relative on outputs that are convex
// mixes of O(1) cache rows.
TEST(CudaMla, PagedLatentAttentionMatchesCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t heads = 4, R = 64, rope = 16, width = R + rope, ps = 4, num_pages = 16;
  const std::vector<HostSeq> seqs = {{3, 9, 0, {3, 7, 1}}, {1, 5, 1, {5, 2}}, {1, 0, -1, {}}};
  const int64_t T = 5;
  const auto pool = RandomVector(num_pages * ps * width, 1);
  const auto rows = RandomVector(T * width, 2);
  const auto qa = RandomVector(T * heads * width, 3, -0.3f, 0.3f);
  const float scale = 1.0f / std::sqrt(192.0f);

  std::vector<float> want_pool = pool, want(T * heads * R, 0.0f);
  int64_t off = 0;
  for (const HostSeq& s : seqs) {
    if (s.slot >= 0) {
      const PagedRows paged{want_pool.data(), s.pages.data(), ps, width};
      for (int32_t i = 0; i < s.count; ++i) {
        std::copy_n(&rows[(off + i) * width], width, paged.Row(s.pos0 + i));
      }
      kimi::cpu::MlaLatentAttention(&want[off * heads * R], &qa[off * heads * width], s.count,
                                    s.pos0, paged, heads, R, rope, scale);
    }
    off += s.count;
  }
  DeviceBatchOf b(seqs);
  DeviceVector<float> dpool(pool), drows(rows), dqa(qa), dout(std::vector<float>(T * heads * R, 7.0f));
  ASSERT_TRUE(MlaWriteCache(dpool.get(), drows.get(), width, b.batch, width, ps, nullptr).ok());
  ASSERT_TRUE(MlaLatentAttention(dout.get(), dqa.get(), dpool.get(), b.batch, heads, R, rope, ps,
                                 scale, nullptr)
                  .ok());
  testing::Sync();
  EXPECT_EQ(dpool.Host(), want_pool);
  EXPECT_LE(testing::WorstRatio(dout.Host(), want, {}, 1e-5, 1e-5), 1.0);
}

TEST(CudaMla, RejectsUnsupportedRank) {
  EXPECT_FALSE(MlaLatentAttention(nullptr, nullptr, nullptr, DeviceBatch{}, 1, kMlaMaxRank + 1, 0,
                                  16, 1.0f, nullptr)
                   .ok());
}

}  // namespace
}  // namespace kimi::cuda
