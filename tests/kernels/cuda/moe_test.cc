#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe_route.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/weight_gemm.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceVector;
using kimi::testing::RandomVector;

// Routing: the same fp32 sigmoid (expf vs __builtin_expf, <= 2 ulp) and the same selection rules;
// random logits have no near-ties at 1e-6, so the ids must match exactly and the weights to 1e-6
// relative.
TEST(CudaMoe, RouteMatchesCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t T = 7, E = 32;
  const auto logits = RandomVector(T * E, 1, -4.0f, 4.0f);
  const auto bias = RandomVector(E, 2, -0.2f, 0.2f);
  for (const cpu::MoeRouteParams p :
       {cpu::MoeRouteParams{E, 4, 1, 1, true, 2.446f}, cpu::MoeRouteParams{E, 6, 4, 2, true, 1.0f},
        cpu::MoeRouteParams{E, 3, 1, 1, false, 1.5f}}) {
    std::vector<int32_t> want_ids(T * p.top_k);
    std::vector<float> want_w(T * p.top_k);
    kimi::cpu::MoeRoute(want_ids.data(), want_w.data(), logits.data(), bias.data(), T, p);
    DeviceVector<float> dl(logits), db(bias), dw(T * p.top_k);
    DeviceVector<int32_t> di(T * p.top_k);
    ASSERT_TRUE(MoeRoute(di.get(), dw.get(), dl.get(), db.get(), T, p, nullptr).ok());
    testing::Sync();
    EXPECT_EQ(di.Host(), want_ids) << p.top_k << " " << p.num_groups;
    EXPECT_LE(testing::WorstRatio(dw.Host(), want_w, {}, 1e-7, 1e-6), 1.0);
  }
}

// Random MXFP4 experts [E * rows, cols], stored as compressed-tensors writes them.
struct Mxfp4 {
  std::vector<uint8_t> data, scales;
  Weight View(const void* d, const uint8_t* s, int64_t rows, int64_t cols) const {
    Weight w;
    w.data = d;
    w.scales = s;
    w.format = WeightFormat::kMxfp4;
    w.rows = rows;
    w.cols = cols;
    return w;
  }
};
Mxfp4 RandomMxfp4(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Mxfp4 m;
  m.data.resize(rows * cols / 2);
  m.scales.resize(rows * cols / 32);
  for (auto& b : m.data) b = static_cast<uint8_t>(rng());
  for (auto& s : m.scales) s = static_cast<uint8_t>(122 + rng() % 6);
  return m;
}

// Permute + grouped GEMMs (gate, up, SiLU-GLU, down) + combine against per-expert CPU MatMuls
// added in ascending expert id. fp32 both sides, sums of 64 / 32 products in another order:
// 1e-5 of the largest output magnitude.
TEST(CudaMoe, GroupedExpertsMatchCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t T = 9, k = 3, E = 8, D = 64, I = 32;
  std::mt19937 rng(7);
  std::vector<int32_t> ids(T * k);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), k, &ids[t * k]);
  }
  const auto weights = RandomVector(T * k, 8, 0.0f, 1.0f);
  const auto x = RandomVector(T * D, 9);
  const Mxfp4 gate = RandomMxfp4(E * I, D, 10), up = RandomMxfp4(E * I, D, 11),
              down = RandomMxfp4(E * D, I, 12);

  std::vector<float> want(T * D, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> order(ids.begin() + t * k, ids.begin() + (t + 1) * k);
    std::vector<int64_t> j_of(E, -1);
    for (int64_t j = 0; j < k; ++j) j_of[ids[t * k + j]] = j;
    std::sort(order.begin(), order.end());
    for (int32_t e : order) {
      std::vector<float> g(I), u(I), r(D);
      const Weight wg = gate.View(gate.data.data(), gate.scales.data(), E * I, D).Rows(e * I, I);
      const Weight wu = up.View(up.data.data(), up.scales.data(), E * I, D).Rows(e * I, I);
      const Weight wd = down.View(down.data.data(), down.scales.data(), E * D, I).Rows(e * D, D);
      kimi::cpu::MatMul(g.data(), &x[t * D], wg, 1);
      kimi::cpu::MatMul(u.data(), &x[t * D], wu, 1);
      kimi::cpu::SiluGlu(g.data(), g.data(), u.data(), I);
      kimi::cpu::MatMul(r.data(), g.data(), wd, 1);
      for (int64_t d = 0; d < D; ++d) want[t * D + d] += weights[t * k + j_of[e]] * r[d];
    }
  }
  float peak = 0.0f;
  for (float v : want) peak = std::max(peak, std::fabs(v));

  const int64_t tiles = MoeMaxTiles(T, k, E, kWeightGemmTileRows);
  DeviceVector<int32_t> di(ids), off(E + 1), sorted(T * k), row_of(T * k), tg(tiles), tr0(tiles),
      tre(tiles), nt(1);
  DeviceVector<float> dw(weights), dx(x), xs(T * k * D), eg(T * k * I), eu(T * k * I),
      res(T * k * D), out(T * D);
  DeviceVector<uint8_t> gd(gate.data), gs(gate.scales), ud(up.data), us(up.scales), dd(down.data),
      ds(down.scales);
  MoePlan plan{off.get(), sorted.get(), row_of.get(), tg.get(), tr0.get(), tre.get(), nt.get()};
  ASSERT_TRUE(MoePermute(plan, di.get(), T, k, E, kWeightGemmTileRows, nullptr).ok());
  ASSERT_TRUE(CopyRows(xs.get(), D, dx.get(), D, sorted.get(), T * k, D, nullptr).ok());
  const Weight wg = gate.View(gd.get(), gs.get(), E * I, D), wu = up.View(ud.get(), us.get(), E * I, D),
               wd = down.View(dd.get(), ds.get(), E * D, I);
  ASSERT_TRUE(WeightGemmGrouped(eg.get(), I, xs.get(), D, wg, I, tg.get(), tr0.get(), tre.get(),
                                nt.get(), tiles, nullptr).ok());
  ASSERT_TRUE(WeightGemmGrouped(eu.get(), I, xs.get(), D, wu, I, tg.get(), tr0.get(), tre.get(),
                                nt.get(), tiles, nullptr).ok());
  ASSERT_TRUE(SiluGlu(eg.get(), eg.get(), eu.get(), T * k * I, nullptr).ok());
  ASSERT_TRUE(WeightGemmGrouped(res.get(), D, eg.get(), I, wd, D, tg.get(), tr0.get(), tre.get(),
                                nt.get(), tiles, nullptr).ok());
  ASSERT_TRUE(MoeCombine(out.get(), res.get(), di.get(), dw.get(), row_of.get(), T, k, D, nullptr).ok());
  testing::Sync();
  EXPECT_LE(testing::WorstRatio(out.Host(), want, {}, 1e-5 * peak, 0.0), 1.0);

  // The plan itself: experts' rows in order, each token's choice at a row of its expert.
  const auto offsets = off.Host(), rows = row_of.Host(), tok = sorted.Host();
  EXPECT_EQ(offsets[E], T * k);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = ids[i], r = rows[i];
    EXPECT_GE(r, offsets[e]);
    EXPECT_LT(r, offsets[e + 1]);
    EXPECT_EQ(tok[r], i / k);
  }
}

}  // namespace
}  // namespace kimi::cuda
