#include "kernels/cpu/mla.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

// The absorbed form against plain attention with decompressed keys and values, through a
// scattered page table.
TEST(Mla, AbsorbedEqualsDecompressedAttention) {
  const int64_t H = 3, Dn = 8, Dr = 4, Dv = 6, R = 12, S = 21, T = 5, page = 4;
  const MlaDims d{H, Dn, Dr, Dv, R};
  const int64_t width = R + Dr;
  const auto rows = testing::RandomVector(S * width, 1);
  const auto q = testing::RandomVector(T * H * (Dn + Dr), 2);
  const auto wkvb = testing::RandomVector(H * (Dn + Dv) * R, 3, -0.3f, 0.3f);
  const int64_t pages = (S + page - 1) / page;
  std::vector<int32_t> table(pages);
  std::vector<float> pool(pages * page * width, 0.0f);
  for (int64_t p = 0; p < pages; ++p) table[p] = static_cast<int32_t>((p * 5 + 1) % pages);  // a permutation (gcd(5, 6) = 1)
  for (int64_t s = 0; s < S; ++s) {
    std::copy_n(&rows[s * width], width, &pool[(table[s / page] * page + s % page) * width]);
  }
  Weight w;
  w.data = wkvb.data();
  w.format = WeightFormat::kF32;
  w.rows = H * (Dn + Dv);
  w.cols = R;
  std::vector<float> out(T * H * Dv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dn + Dr));
  MlaAttention(out.data(), q.data(), T, S - T, PagedRows{pool.data(), table.data(), page, width},
               w, d, scale);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = &q[(t * H + h) * (Dn + Dr)];
      const int64_t visible = S - T + t + 1;
      std::vector<double> sc(visible);
      double mx = -1e300;
      for (int64_t s = 0; s < visible; ++s) {
        double acc = 0.0;
        for (int64_t n = 0; n < Dn; ++n) {
          double k = 0.0;  // k_nope = W_UK c
          for (int64_t r = 0; r < R; ++r) k += wkvb[(h * (Dn + Dv) + n) * R + r] * rows[s * width + r];
          acc += qh[n] * k;
        }
        for (int64_t e = 0; e < Dr; ++e) acc += qh[Dn + e] * rows[s * width + R + e];
        sc[s] = acc * scale;
        mx = std::max(mx, sc[s]);
      }
      double den = 0.0;
      for (double& v : sc) den += (v = std::exp(v - mx));
      for (int64_t j = 0; j < Dv; ++j) {
        double want = 0.0;
        for (int64_t s = 0; s < visible; ++s) {
          double v = 0.0;
          for (int64_t r = 0; r < R; ++r) {
            v += wkvb[(h * (Dn + Dv) + Dn + j) * R + r] * rows[s * width + r];
          }
          want += sc[s] / den * v;
        }
        EXPECT_NEAR(out[(t * H + h) * Dv + j], want, 2e-6) << t << " " << h << " " << j;
      }
    }
  }
}

}  // namespace
}  // namespace kimi::cpu
