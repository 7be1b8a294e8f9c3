#include "kernels/cuda/attn_res.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attn_res.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;

// fp32 on the GPU against double sums on the CPU: scores differ by a few ulps of |v||w| sums, the
// softmax and the mix by as much; 1e-5 relative to the output (plus 1e-5 absolute, outputs O(1)).
TEST(CudaAttnRes, MatchesCpu) {
  KIMI_REQUIRE_GPU();
  for (const int64_t nb : {1, 3, 8}) {
    const int64_t T = 5, H = 1000, stride = 9 * H;  // bank rows of a wider bank (K3: 8 + 1)
    const auto bank = kimi::testing::RandomVector(T * stride, 1, -2.0f, 2.0f);
    const auto partial = kimi::testing::RandomVector(T * H, 2, -2.0f, 2.0f);
    const auto w = kimi::testing::RandomVector(H, 3, -0.1f, 0.1f);
    std::vector<float> want(T * H), want_p(T * (nb + 1));
    kimi::cpu::AttnRes(want.data(), want_p.data(), bank.data(), stride, nb, partial.data(),
                       w.data(), T, H, 1e-5f);
    DeviceVector<float> db(bank), dp(partial), dw(w), dout(T * H), dprob(T * (nb + 1));
    ASSERT_TRUE(AttnRes(dout.get(), dprob.get(), db.get(), stride, nb, dp.get(), dw.get(), T, H,
                        1e-5f, nullptr)
                    .ok());
    testing::Sync();
    EXPECT_LE(testing::WorstRatio(dout.Host(), want, {}, 1e-5, 1e-5), 1.0) << nb;
    EXPECT_LE(testing::WorstRatio(dprob.Host(), want_p, {}, 1e-6, 1e-5), 1.0) << nb;
  }
}

TEST(CudaAttnRes, RejectsTooManyRows) {
  EXPECT_FALSE(AttnRes(nullptr, nullptr, nullptr, 0, kAttnResMaxRows, nullptr, nullptr, 1, 1, 1e-5f,
                       nullptr)
                   .ok());
}

}  // namespace
}  // namespace kimi::cuda
