// The AMX kernels (kernels/cpu/matmul_amx.cc) on kTiles-packed bf16 and MXFP4 weights: against
// float64 references, bit for bit the same alone, batched, split over threads or cut mid-group, and
// the exact three-term split of fp32 activations they rest on. Skipped (with the reason) on
// machines without AMX-BF16; the layout and the split are checked everywhere.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

struct Bf16Matrix {
  std::vector<uint16_t> data;
  std::vector<double> dense;  // the stored values, for the reference
  Weight w;
};

Bf16Matrix MakeBf16(int64_t n, int64_t k, uint32_t seed) {
  Bf16Matrix s;
  const std::vector<float> v = testing::RandomVector(n * k, seed);
  s.data.resize(n * k);
  s.dense.resize(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    s.data[i] = F32ToBf16(v[i]);
    s.dense[i] = Bf16ToF32(s.data[i]);
  }
  s.w.data = s.data.data();
  s.w.format = WeightFormat::kBF16;
  s.w.rows = n;
  s.w.cols = k;
  return s;
}

struct Mxfp4Matrix {
  std::vector<uint8_t> codes, scales;
  std::vector<double> dense;  // E2M1(code) * 2^(scale - 127), for the reference
  Weight w;
};

// Random codes (every one of the 16, zeros and -0 included) and scales in [lo, hi].
Mxfp4Matrix MakeMxfp4(int64_t n, int64_t k, uint32_t seed, int lo = 118, int hi = 131) {
  std::mt19937 rng(seed);
  Mxfp4Matrix s;
  s.codes.resize(n * k / 2);
  s.scales.resize(n * k / 32);
  for (auto& b : s.codes) b = static_cast<uint8_t>(rng());
  for (auto& b : s.scales) b = static_cast<uint8_t>(lo + static_cast<int>(rng() % (hi - lo + 1)));
  s.dense = testing::Mxfp4Values(s.codes, s.scales, n, k);
  s.w = Weight{.data = s.codes.data(),
               .scales = s.scales.data(),
               .format = WeightFormat::kMxfp4,
               .rows = n,
               .cols = k};
  return s;
}

// float64 reference of row i of x (rounded to bf16 first when `bf16`) times row j of s, and the
// fp32 bound on its error every path is held to (matmul_test.cc): 4 k eps times the largest term.
template <class Matrix>
std::pair<double, double> Reference(const Matrix& s, const std::vector<float>& x, int64_t i,
                                    int64_t j, bool bf16) {
  const int64_t k = s.w.cols;
  double ref = 0.0, scale = 0.0;
  for (int64_t c = 0; c < k; ++c) {
    const double xv = bf16 ? Bf16ToF32(F32ToBf16(x[i * k + c])) : x[i * k + c];
    ref += xv * s.dense[j * k + c];
    scale = std::max(scale, std::fabs(xv * s.dense[j * k + c]));
  }
  return {ref, 4.0 * k * 1.2e-7 * scale};
}

// Switches to AMX for the test's lifetime; false (and nothing changed) without it.
class AmxIsa {
 public:
  AmxIsa() : saved_(MatMulIsa()), ok_(SetMatMulIsa(Isa::kAmx)) {}
  ~AmxIsa() {
    SetMatMulIsa(saved_);
    ThreadPool::Global().SetActiveThreads(0);
  }
  bool ok() const { return ok_; }

 private:
  Isa saved_;
  bool ok_;
};

double Bits(float f) { return static_cast<double>(f); }

// x = hi + mid + lo exactly for finite x above 2^-100 (each term a bf16), whole in hi when not
// finite; zero padding; written as row 0 of two in Problem::xt's layout, row 1's words untouched.
TEST(AmxSplit, ThreeBf16TermsAreExact) {
  std::vector<float> x = testing::RandomVector(1000, 3, -1e4f, 1e4f);
  for (float& v : testing::RandomVector(200, 4, -1e-30f, 1e-30f)) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1.0f, 3.0f + 1.0f / 4096, 0.1f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), 1e-38f, 1e-44f}) {
    x.push_back(v);
    x.push_back(-v);
  }
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  for (uint32_t bits : {0x7f800001u, 0xff800003u, 0x7fc00000u}) {  // NaNs, payload low or high
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  const int64_t k = static_cast<int64_t>(x.size()), kp = (k + 31) / 32 * 32;
  const int64_t block_stride = 2 * 96;  // [kp / 32][2 rows][3][32]
  std::vector<uint16_t> xt(kp / 32 * block_stride, 1);
  matmul_internal::SplitRowToBf16x3(xt.data(), block_stride, x.data(), k, kp);
  const auto term = [&](int t, int64_t c) { return xt[c / 32 * block_stride + 32 * t + c % 32]; };
  for (int64_t c = 0; c < k; ++c) {
    const double h = Bf16ToF32(term(0, c)), m = Bf16ToF32(term(1, c)), l = Bf16ToF32(term(2, c));
    if (!std::isfinite(x[c])) {
      EXPECT_TRUE(std::isnan(x[c]) ? std::isnan(h) : h == x[c]) << c;
      EXPECT_EQ(term(1, c), 0);
      EXPECT_EQ(term(2, c), 0);
      continue;
    }
    if (std::fabs(x[c]) < std::ldexp(1.0, -100)) {
      // Near the subnormals a remainder loses its bits below bf16's smallest step (2^-133); the
      // unit treats bf16 subnormals as zero in any case (matmul_amx.cc).
      EXPECT_LE(std::fabs(h + m + l - x[c]), std::ldexp(1.0, -126)) << "x = " << x[c];
      continue;
    }
    EXPECT_EQ(h + m + l, Bits(x[c])) << "x = " << x[c];
    EXPECT_LE(std::fabs(m), std::fabs(x[c]) / 128) << x[c];  // each term the next eight bits
    EXPECT_LE(std::fabs(l), std::fabs(m) / 128) << x[c];
  }
  for (int64_t c = k; c < kp; ++c) {
    EXPECT_EQ(term(0, c) | term(1, c) | term(2, c), 0);
  }
  for (int64_t b = 0; b < kp / 32; ++b) {
    for (int64_t j = 96; j < block_stride; ++j) EXPECT_EQ(xt[b * block_stride + j], 1) << b;
  }
}

// The shapes reach every part of the tile loop: 1..16 x rows (one x tile of fewer rows), 17..32
// (two), 33, 40 and 70 (several pairs and a short last one); an odd number of weight groups (a
// lone last group); one block of columns and many; slices of K with more than 32 x rows (40 x 160
// x 4096: four slices of 32 blocks; 40 x 272 x 2048: two, and weight chunks of 16 groups, the
// second a lone group).
using Shapes = std::vector<std::tuple<int64_t, int64_t, int64_t>>;  // m, n, k
const Shapes kShapes = {{1, 16, 32},    {1, 48, 2048}, {3, 32, 96},     {16, 16, 64},
                        {17, 80, 128},  {31, 32, 320}, {32, 48, 64},    {33, 16, 1024},
                        {70, 112, 256}, {5, 64, 4096}, {40, 160, 4096}, {40, 272, 2048}};

// The checks bf16 and MXFP4 weights share, on matrices from make(n, k, seed) (.w unpacked, .dense
// its values).

// Against float64 (x rounded to bf16 first with bf16 activations). fp32 activations: the split
// makes every product exact, so the error is the fp32 accumulation's alone, held to the same bound
// as every other instruction set (matmul_test.cc: 4 k eps times the largest term).
template <class Make>
void CheckAgainstReference(const Make& make, const Shapes& shapes, bool bf16, uint32_t seed) {
  ActivationScope scope(bf16 ? ActivationDtype::kBf16 : ActivationDtype::kF32);
  for (auto [m, n, k] : shapes) {
    auto s = make(n, k, seed);
    PackInPlace(&s.w);
    ASSERT_EQ(s.w.layout, PackLayout::kTiles);
    const std::vector<float> x = testing::RandomVector(m * k, seed + 1);
    std::vector<float> y(m * n);
    MatMul(y.data(), x.data(), s.w, m);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const auto [ref, tol] = Reference(s, x, i, j, bf16);
        ASSERT_NEAR(y[i * n + j], ref, tol)
            << m << "x" << n << "x" << k << (bf16 ? " bf16" : " fp32") << " at " << i << "," << j;
      }
    }
  }
}

// A row's bits do not depend on the batch, the thread count, the other weights of a MatMulMany
// (behind an 8-row weight, which the ranges round up to a whole group), or a view of whole groups.
template <class Make>
void CheckBatchThreadsAndRanges(const Make& make, const Shapes& shapes, uint32_t seed) {
  for (const bool bf16 : {false, true}) {
    ActivationScope scope(bf16 ? ActivationDtype::kBf16 : ActivationDtype::kF32);
    for (auto [m, n, k] : shapes) {
      auto s = make(n, k, seed);
      PackInPlace(&s.w);
      ASSERT_EQ(s.w.layout, PackLayout::kTiles);
      ASSERT_TRUE(s.w.packed);
      Bf16Matrix head = MakeBf16(8, k, seed + 1);  // 8 rows: left unpacked (tiles made on the fly)
      PackInPlace(&head.w);
      ASSERT_FALSE(head.w.packed);
      const std::vector<float> x = testing::RandomVector(m * k, seed + 2);
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        ThreadPool::Global().SetActiveThreads(threads);
        std::vector<float> y(m * n), yh(m * 8), row(n);
        MatMul(y.data(), x.data(), s.w, m);
        if (first.empty()) first = y;
        ASSERT_EQ(y, first) << "threads " << threads << " " << m << "x" << n << "x" << k;
        for (int64_t i = 0; i < m; i += 4) {
          MatMul(row.data(), x.data() + i * k, s.w, 1);
          for (int64_t j = 0; j < n; ++j) ASSERT_EQ(row[j], first[i * n + j]) << i << "," << j;
        }
        std::fill(y.begin(), y.end(), 0.0f);
        const MatMulTarget targets[] = {{yh.data(), 8, &head.w}, {y.data(), n, &s.w}};
        MatMulMany(targets, x.data(), k, m);
        ASSERT_EQ(y, first) << "behind an 8-row weight, threads " << threads;
        if (n < 2 * kTileRows) continue;
        std::vector<float> v(m * kTileRows);
        MatMul(v.data(), x.data(), s.w.Rows(kTileRows, kTileRows), m);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < kTileRows; ++j) {
            ASSERT_EQ(v[i * kTileRows + j], first[i * n + kTileRows + j]);
          }
        }
      }
    }
  }
}

// An unpacked weight (a memory-mapped checkpoint, a shard's view of rows) takes the tile kernels
// too, its tiles made from its rows: the packed weight's bits, and any row count (rows that are
// not whole groups, at one and two x tiles, against the reference).
template <class Make>
void CheckUnpackedEqualsPacked(const Make& make, const Shapes& shapes, uint32_t seed) {
  for (const bool bf16 : {false, true}) {
    ActivationScope scope(bf16 ? ActivationDtype::kBf16 : ActivationDtype::kF32);
    for (auto [m, n, k] : shapes) {
      const auto u = make(n, k, seed);
      auto p = make(n, k, seed);
      PackInPlace(&p.w);
      ASSERT_TRUE(p.w.packed);
      const std::vector<float> x = testing::RandomVector(m * k, seed + 1);
      std::vector<float> yu(m * n), yp(m * n);
      MatMul(yu.data(), x.data(), u.w, m);
      MatMul(yp.data(), x.data(), p.w, m);
      ASSERT_EQ(yu, yp) << m << "x" << n << "x" << k << (bf16 ? " bf16" : " fp32");
    }
    for (const auto& [m, n] :
         {std::pair<int64_t, int64_t>{3, 33}, {3, 8}, {3, 1}, {20, 33}, {21, 40}, {37, 24}}) {
      const int64_t k = 96;
      const auto u = make(n, k, seed + 2);
      const std::vector<float> x = testing::RandomVector(m * k, seed + 3);
      std::vector<float> y(m * n);
      MatMul(y.data(), x.data(), u.w, m);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const auto [ref, tol] = Reference(u, x, i, j, bf16);
          ASSERT_NEAR(y[i * n + j], ref, tol) << n << " rows";
        }
      }
    }
  }
}

// Another instruction set reads a kTiles weight too (the scalar fallback): every value, and the
// product to fp32 accuracy.
template <class Make>
void CheckOtherIsasReadTheLayout(const Make& make, uint32_t seed) {
  const Isa saved = MatMulIsa();
  const int64_t m = 3, n = 32, k = 96;
  auto s = make(n, k, seed);
  PackInPlace(&s.w, PackLayout::kTiles);
  ASSERT_TRUE(s.w.packed);
  const std::vector<float> x = testing::RandomVector(m * k, seed + 1);
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    std::vector<float> y(m * n), row(k);
    MatMul(y.data(), x.data(), s.w, m);
    for (int64_t j = 0; j < n; ++j) {
      DequantizeRow(row.data(), s.w, j);
      for (int64_t c = 0; c < k; ++c) ASSERT_EQ(row[c], s.dense[j * k + c]) << j << "," << c;
      for (int64_t i = 0; i < m; ++i) {
        const auto [ref, tol] = Reference(s, x, i, j, false);
        ASSERT_NEAR(y[i * n + j], ref, tol) << IsaName(isa);
      }
    }
  }
  SetMatMulIsa(saved);
}

TEST(AmxTiles, ActivationsMatchDoubleReference) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  CheckAgainstReference(MakeBf16, kShapes, false, 41);
  CheckAgainstReference(MakeBf16, kShapes, true, 43);
}

TEST(AmxTiles, BatchThreadsAndRangesChangeNoBit) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  CheckBatchThreadsAndRanges(MakeBf16, kShapes, 45);
}

TEST(AmxTiles, UnpackedEqualsPackedBitwise) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  CheckUnpackedEqualsPacked(MakeBf16, kShapes, 52);
}

TEST(AmxTiles, OtherInstructionSetsReadTheLayout) { CheckOtherIsasReadTheLayout(MakeBf16, 50); }

// Strided x and y (ldx > k, ldy > n), as the engine's per-head products use them, in both
// activation modes; 40 rows (unpacked: a last group of 8, stored through the scratch tile) and 32.
TEST(AmxTiles, StridedInputAndOutput) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  for (const bool bf16 : {false, true}) {
    ActivationScope scope(bf16 ? ActivationDtype::kBf16 : ActivationDtype::kF32);
    for (const int64_t n : {32, 40}) {
      const int64_t m = 20, k = 64, ldx = 100, ldy = 50;
      Bf16Matrix s = MakeBf16(n, k, 48);
      PackInPlace(&s.w);
      ASSERT_EQ(s.w.packed, n % kTileRows == 0);
      const std::vector<float> x = testing::RandomVector(m * ldx, 49);
      std::vector<float> y(m * ldy, -7.0f), dense(m * n), xd(m * k);
      for (int64_t i = 0; i < m; ++i) std::copy_n(x.begin() + i * ldx, k, xd.begin() + i * k);
      MatMul(y.data(), ldy, x.data(), ldx, s.w, m);
      MatMul(dense.data(), xd.data(), s.w, m);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < ldy; ++j) {
          if (j < n) {
            ASSERT_EQ(y[i * ldy + j], dense[i * n + j]) << n << " rows";
          } else {
            ASSERT_EQ(y[i * ldy + j], -7.0f);  // beyond the weight's rows: untouched
          }
        }
      }
    }
  }
}

// The tile kernel itself on a range that starts and ends mid-group (n0, n1 multiples of 8, which
// its contract allows; MatMulMany now hands it whole groups): those columns of the whole product,
// the rest of y untouched.
TEST(AmxTiles, KernelRangesMayCutAGroup) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  const matmul_internal::Kernels* kernels = matmul_internal::AmxKernels();
  const int64_t m = 20, n = 48, k = 64;
  Bf16Matrix s = MakeBf16(n, k, 60);
  PackInPlace(&s.w);
  ASSERT_TRUE(s.w.packed);
  const std::vector<float> x = testing::RandomVector(m * k, 61);
  std::vector<float> whole(m * n);
  {
    ActivationScope bf16(ActivationDtype::kBf16);
    MatMul(whole.data(), x.data(), s.w, m);
  }
  std::vector<uint16_t> xb(m * k);
  for (int64_t i = 0; i < m; ++i) {
    matmul_internal::RoundRowToBf16(xb.data() + i * k, x.data() + i * k, k, k);
  }
  std::vector<float> y(m * n, -7.0f);
  matmul_internal::Problem p{y.data(), n, nullptr, k, &s.w, m, xb.data()};
  kernels->range_tiles_bf16(p, 8, 40);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(y[i * n + j], j >= 8 && j < 40 ? whole[i * n + j] : -7.0f) << i << "," << j;
    }
  }
}

// --- MXFP4 weights packed as kTiles ---

// x rows across every count of x tiles and chunks (five rows a tile with fp32 activations, 16 with
// bf16 ones; four tiles a chunk), one to 65 groups (the last shape: two chunks of x rows with fp32
// activations, over two 512 KiB chunks of codes), one to 64 blocks.
const Shapes kMxfp4Shapes = {{1, 16, 32},    {1, 48, 2048},   {2, 32, 96},   {3, 16, 64},
                             {5, 32, 256},   {6, 48, 128},    {16, 16, 64},  {17, 80, 96},
                             {20, 32, 256},  {21, 16, 64},    {40, 64, 128}, {65, 112, 256},
                             {70, 32, 1024}, {25, 1040, 1024}};

TEST(AmxMxfp4Tiles, ActivationsMatchDoubleReference) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  const auto make = [](int64_t n, int64_t k, uint32_t seed) { return MakeMxfp4(n, k, seed); };
  CheckAgainstReference(make, kMxfp4Shapes, false, 71);
  CheckAgainstReference(make, kMxfp4Shapes, true, 73);
}

TEST(AmxMxfp4Tiles, BatchThreadsAndRangesChangeNoBit) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  CheckBatchThreadsAndRanges(
      [](int64_t n, int64_t k, uint32_t seed) { return MakeMxfp4(n, k, seed); }, kMxfp4Shapes, 75);
}

TEST(AmxMxfp4Tiles, UnpackedEqualsPackedBitwise) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  CheckUnpackedEqualsPacked(
      [](int64_t n, int64_t k, uint32_t seed) { return MakeMxfp4(n, k, seed); }, kMxfp4Shapes, 82);
}

TEST(AmxMxfp4Tiles, OtherInstructionSetsReadTheLayout) {
  CheckOtherIsasReadTheLayout(
      [](int64_t n, int64_t k, uint32_t seed) { return MakeMxfp4(n, k, seed); }, 80);
}

// Scales at the ends of what packed tiles hold (kTilesMinScale, kTilesMaxScale: the exponent sums
// reach the smallest and largest normal bf16) pack and stay exact; one scale beyond either end
// leaves the weight unpacked (its tiles then made from its rows, where a value below 2^-126 counts
// as zero, and 6 x 2^126 is past fp32's range anyway: only the layout is checked there).
TEST(AmxMxfp4Tiles, ScalesAtTheEndsAndBeyond) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  const int64_t m = 3, n = 32, k = 64;
  for (const auto& [lo, hi, tiles] :
       {std::tuple<int, int, bool>{kTilesMinScale, kTilesMinScale + 3, true},
        {kTilesMaxScale - 3, kTilesMaxScale, true},
        {kTilesMinScale - 1, kTilesMinScale + 3, false},
        {kTilesMaxScale - 3, kTilesMaxScale + 1, false}}) {
    Mxfp4Matrix s = MakeMxfp4(n, k, 73, lo, hi);
    if (!tiles) s.scales[5] = static_cast<uint8_t>(lo < kTilesMinScale ? lo : hi);
    ASSERT_EQ(CanPack(s.w, PackLayout::kTiles), tiles) << lo << ".." << hi;
    // A block of zero codes (+0 and -0) may have any scale (a quantiser's 0 for an all-zero block).
    for (int64_t i = 0; i < 16; ++i)
      s.codes[7 * 16 + i] = static_cast<uint8_t>(i % 2 ? 0x88 : 0x08);
    for (int64_t c = 7 * 32; c < 8 * 32; ++c) s.dense[c] = 0.0;
    s.scales[7] = 0;
    ASSERT_EQ(CanPack(s.w, PackLayout::kTiles), tiles) << "with a zero block at scale 0";
    s.scales[7] = 255;  // NaN: the block's zeros are NaN on every other path, so no tiles
    ASSERT_FALSE(CanPack(s.w, PackLayout::kTiles)) << "with a zero block at scale 255";
    s.scales[7] = 0;
    PackInPlace(&s.w);
    ASSERT_EQ(s.w.packed, tiles);
    if (!tiles) continue;
    ASSERT_EQ(s.w.layout, PackLayout::kTiles);
    // x scaled so that every product stays a normal float.
    std::vector<float> x = testing::RandomVector(m * k, 74);
    const float x_scale = lo < 100 ? 0x1p100f : 0x1p-100f;
    for (float& v : x) v *= x_scale;
    std::vector<float> y(m * n);
    MatMul(y.data(), x.data(), s.w, m);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const auto [ref, tol] = Reference(s, x, i, j, false);
        ASSERT_NEAR(y[i * n + j], ref, tol) << lo << ".." << hi << " at " << i << "," << j;
      }
    }
  }
}

// The kernel itself on a range that starts and ends mid-group (as the bf16 kernel's test), with
// strided output rows.
TEST(AmxMxfp4Tiles, KernelRangesMayCutAGroup) {
  AmxIsa amx;
  if (!amx.ok()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  const matmul_internal::Kernels* kernels = matmul_internal::AmxKernels();
  const int64_t m = 7, n = 48, k = 64, ldy = 50;
  Mxfp4Matrix s = MakeMxfp4(n, k, 78);
  PackInPlace(&s.w);
  ASSERT_EQ(s.w.layout, PackLayout::kTiles);
  const std::vector<float> x = testing::RandomVector(m * k, 79);
  std::vector<float> whole(m * n);
  MatMul(whole.data(), x.data(), s.w, m);
  std::vector<uint16_t> xt(3 * m * k);
  for (int64_t i = 0; i < m; ++i) {
    matmul_internal::SplitRowToBf16x3(&xt[96 * i], 96 * m, x.data() + i * k, k, k);
  }
  std::vector<float> y(m * ldy, -7.0f);
  matmul_internal::Problem p{y.data(), ldy, nullptr, k, &s.w, m};
  p.xt = xt.data();
  kernels->range_tiles(p, 8, 40);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldy; ++j) {
      ASSERT_EQ(y[i * ldy + j], j >= 8 && j < 40 ? whole[i * n + j] : -7.0f) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace kimi::cpu
