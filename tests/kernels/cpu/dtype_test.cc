#include "kernels/dtype.h"

#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"

namespace kimi {
namespace {

// GCC's _Float16 (IEEE binary16, round to nearest even) is the outside reference.
TEST(DType, F16MatchesCompilerHalf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    _Float16 ref;
    std::memcpy(&ref, &h, 2);
    const float want = static_cast<float>(ref);
    const float got = F16ToF32(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
    } else {
      ASSERT_EQ(got, want) << "bits " << bits;
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) {
    float f = dist(rng);
    if (i % 3 == 0) f *= 1e-4f;  // subnormal halves
    if (i % 5 == 0) f *= 1e-7f;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(F32ToF16(f), want) << f;
  }
}

// bf16 rounding: the result is the nearer of the two bf16 neighbours, ties to the even one.
TEST(DType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    if ((bits & 0x7f800000u) == 0x7f800000u) continue;  // skip inf/nan
    if (i % 10 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    float f;
    std::memcpy(&f, &bits, 4);
    const uint16_t lo = static_cast<uint16_t>(bits >> 16);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    if ((hi & 0x7f80u) == 0x7f80u) continue;  // rounding up reaches infinity: not a neighbour
    const double dlo = std::fabs(static_cast<double>(Bf16ToF32(lo)) - f);
    const double dhi = std::fabs(static_cast<double>(Bf16ToF32(hi)) - f);
    const uint16_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(F32ToBf16(f), want) << f;
  }
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kU8, DType::kI32, DType::kI64,
                  DType::kF64}) {
    DType back;
    ASSERT_TRUE(ParseDType(DTypeName(t), &back));
    EXPECT_EQ(back, t);
  }
  DType t;
  EXPECT_FALSE(ParseDType("F8_E4M3", &t));
}

}  // namespace
}  // namespace kimi
