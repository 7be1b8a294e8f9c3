#include "kernels/cpu/activation.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

TEST(Activation, SiluGlu) {
  const auto g = testing::RandomVector(257, 1, -8.0f, 8.0f);
  const auto u = testing::RandomVector(257, 2, -8.0f, 8.0f);
  std::vector<float> out(257);
  SiluGlu(out.data(), g.data(), u.data(), 257);
  for (int i = 0; i < 257; ++i) {
    const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
  }
}

TEST(Activation, SituGluSoftcapsBothBranches) {
  const auto g = testing::RandomVector(257, 3, -60.0f, 60.0f);
  const auto u = testing::RandomVector(257, 4, -200.0f, 200.0f);
  std::vector<float> out(257);
  SituGlu(out.data(), g.data(), u.data(), 257, 4.0f, 25.0f);
  for (int i = 0; i < 257; ++i) {
    const double gd = g[i], ud = u[i];
    const double want =
        4.0 * std::tanh(gd / 4.0) / (1.0 + std::exp(-gd)) * 25.0 * std::tanh(ud / 25.0);
    EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
    EXPECT_LE(std::fabs(out[i]), 100.0f + 1e-3f);  // |a| < 4, |u| < 25
  }
}

// Every instruction set's vector exp/tanh against float64, over a dense sweep (tails included), and
// a value's result does not depend on its position in the buffer.
TEST(Activation, EveryIsaIsAccurateAndPositionIndependent) {
  const Isa saved = MatMulIsa();
  const int n = 20011;
  std::vector<float> g(n), u(n);
  for (int i = 0; i < n; ++i) {
    g[i] = -100.0f + 200.0f * i / (n - 1);
    u[i] = 300.0f - 600.0f * ((i * 7919) % n) / (n - 1);
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    std::vector<float> silu(n), situ(n), sig(g), gated(u);
    SiluGlu(silu.data(), g.data(), u.data(), n);
    SituGlu(situ.data(), g.data(), u.data(), n, 4.0f, 25.0f);
    SigmoidInPlace(sig.data(), n);
    MulSigmoid(gated.data(), g.data(), n);
    for (int i = 0; i < n; ++i) {
      const double gd = g[i], ud = u[i], s = 1.0 / (1.0 + std::exp(-gd));
      const double want_silu = gd * s * ud;
      const double want_situ = 4.0 * std::tanh(gd / 4.0) * s * 25.0 * std::tanh(ud / 25.0);
      ASSERT_NEAR(silu[i], want_silu, 1e-6 * (1 + std::fabs(want_silu))) << IsaName(isa) << " " << gd;
      ASSERT_NEAR(situ[i], want_situ, 1e-6 * (1 + std::fabs(want_situ))) << IsaName(isa) << " " << gd << " " << ud;
      ASSERT_NEAR(sig[i], s, 1e-7 * (1 + s)) << IsaName(isa) << " " << gd;
      ASSERT_NEAR(gated[i], s * ud, 1e-6 * (1 + std::fabs(s * ud))) << IsaName(isa);
    }
    for (int off : {1, 5, 13}) {  // shifted by a few places, through the tail
      std::vector<float> shifted(n - off);
      SituGlu(shifted.data(), g.data() + off, u.data() + off, n - off, 4.0f, 25.0f);
      for (int i = 0; i < n - off; ++i) ASSERT_EQ(shifted[i], situ[i + off]) << IsaName(isa);
    }
  }
  SetMatMulIsa(saved);
}

// beta is a config value (activation_situ_beta): a power of two takes gate * (1 / beta), any other
// gate / beta. Both against float64 on every instruction set, the same tolerance as above.
TEST(Activation, SituGluAnyBeta) {
  const Isa saved = MatMulIsa();
  const int n = 4001;
  std::vector<float> g(n), u(n);
  for (int i = 0; i < n; ++i) {
    g[i] = -40.0f + 80.0f * i / (n - 1);
    u[i] = 90.0f - 180.0f * ((i * 613) % n) / (n - 1);
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    for (float beta : {3.0f, 0.5f, 8.0f, 5.5f}) {
      std::vector<float> out(n);
      SituGlu(out.data(), g.data(), u.data(), n, beta, 25.0f);
      for (int i = 0; i < n; ++i) {
        const double gd = g[i], ud = u[i], b = beta;
        const double want =
            b * std::tanh(gd / b) / (1.0 + std::exp(-gd)) * 25.0 * std::tanh(ud / 25.0);
        ASSERT_NEAR(out[i], want, 1e-6 * (1 + std::fabs(want)))
            << IsaName(isa) << " " << beta << " " << gd;
      }
    }
  }
  SetMatMulIsa(saved);
}

// tanh near zero keeps its relative accuracy (the polynomial branch).
TEST(Activation, SituNearZeroIsRelativelyAccurate) {
  std::vector<float> g = {1e-6f, -3e-4f, 0.01f, -0.3f, 2.4f, -2.6f}, u = {1e-5f, 2e-3f, -0.5f, 15.0f, -15.7f, 20.0f};
  std::vector<float> out(g.size());
  SituGlu(out.data(), g.data(), u.data(), static_cast<int64_t>(g.size()), 4.0f, 25.0f);
  for (size_t i = 0; i < g.size(); ++i) {
    const double gd = g[i], ud = u[i];
    const double want = 4.0 * std::tanh(gd / 4.0) / (1.0 + std::exp(-gd)) * 25.0 * std::tanh(ud / 25.0);
    EXPECT_NEAR(out[i], want, 4e-7 * std::fabs(want)) << i;
  }
}

// softplus (Kimi Linear's KDA gate) against float64 log1p(exp(x)) on every instruction set: within
// 3e-7 relative from -87 up (the vector exp and log are each within ~2 ulp = 1.2e-7 and the
// log1p correction is exact; measured 1.9e-7, libm 1.2e-7), x itself above 20 (torch's threshold),
// and below exp(-87) = 1.7e-38 under -87 (where exp(x) leaves the normal floats); independent of
// position.
TEST(Activation, SoftplusOnEveryIsa) {
  const Isa saved = MatMulIsa();
  const int n = 40009;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = -100.0f + 200.0f * i / (n - 1);
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    std::vector<float> y = x;
    SoftplusInPlace(y.data(), n);
    for (int i = 0; i < n; ++i) {
      const double xd = x[i];
      if (xd > 20.0) {
        ASSERT_EQ(y[i], x[i]) << IsaName(isa);
      } else if (xd >= -87.0) {
        const double want = std::log1p(std::exp(xd));
        ASSERT_NEAR(y[i], want, 3e-7 * want) << IsaName(isa) << " " << xd;
      } else {
        ASSERT_GE(y[i], 0.0f) << IsaName(isa) << " " << xd;
        ASSERT_LE(y[i], 1.7e-38f) << IsaName(isa) << " " << xd;  // exp(-87)
      }
    }
    for (int off : {1, 7}) {
      std::vector<float> shifted(x.begin() + off, x.end());
      SoftplusInPlace(shifted.data(), n - off);
      for (int i = 0; i < n - off; ++i) ASSERT_EQ(shifted[i], y[i + off]) << IsaName(isa);
    }
  }
  SetMatMulIsa(saved);
}

}  // namespace
}  // namespace kimi::cpu
