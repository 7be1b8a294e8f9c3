#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

struct Stored {
  std::vector<uint8_t> data, scales;
  std::vector<double> dense;  // the exact values the format holds, for the reference
  Weight w;
};

using testing::E2m1;

Stored MakeWeight(WeightFormat f, int64_t n, int64_t k, uint32_t seed) {
  Stored s;
  const std::vector<float> v = testing::RandomVector(n * k, seed);
  s.dense.resize(n * k);
  switch (f) {
    case WeightFormat::kF32:
      s.data.resize(n * k * 4);
      std::memcpy(s.data.data(), v.data(), n * k * 4);
      for (int64_t i = 0; i < n * k; ++i) s.dense[i] = v[i];
      break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      s.data.resize(n * k * 2);
      for (int64_t i = 0; i < n * k; ++i) {
        const uint16_t h = f == WeightFormat::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
        std::memcpy(&s.data[2 * i], &h, 2);
        s.dense[i] = f == WeightFormat::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
      }
      break;
    case WeightFormat::kMxfp4: {
      std::mt19937 rng(seed);
      s.data.resize(n * k / 2);
      s.scales.resize(n * k / 32);
      for (auto& b : s.data) b = static_cast<uint8_t>(rng());
      for (auto& b : s.scales) b = static_cast<uint8_t>(120 + rng() % 10);
      s.dense = testing::Mxfp4Values(s.data, s.scales, n, k);
      break;
    }
  }
  s.w.data = s.data.data();
  s.w.scales = s.scales.empty() ? nullptr : s.scales.data();
  s.w.format = f;
  s.w.rows = n;
  s.w.cols = k;
  return s;
}

// Every E2M1 code under every E8M0 scale: 256 rows of 64 columns, row r with scale byte r and two
// blocks of every code pair.
Stored EveryCodeEveryScale() {
  constexpr int64_t kRows = 256, kCols = 64;
  Stored s;
  s.data.resize(kRows * kCols / 2);
  s.scales.resize(kRows * kCols / 32);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t i = 0; i < kCols / 2; ++i) {
      s.data[r * kCols / 2 + i] = static_cast<uint8_t>((i % 16) | ((15 - (i + r) % 16) << 4));
    }
    for (int64_t b = 0; b < kCols / 32; ++b) s.scales[r * kCols / 32 + b] = static_cast<uint8_t>(r);
  }
  s.w = Weight{.data = s.data.data(),
               .scales = s.scales.data(),
               .format = WeightFormat::kMxfp4,
               .rows = kRows,
               .cols = kCols};
  return s;
}

// w's values (DequantizeRow) rounded to a bf16 weight; `dense` holds the fp32 values rounded from.
Stored Bf16Copy(const Weight& w) {
  Stored s;
  s.data.resize(w.rows * w.cols * 2);
  s.dense.resize(w.rows * w.cols);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(row.data(), w, r);
    for (int64_t c = 0; c < w.cols; ++c) {
      const uint16_t h = F32ToBf16(row[c]);
      std::memcpy(&s.data[2 * (r * w.cols + c)], &h, 2);
      s.dense[r * w.cols + c] = row[c];
    }
  }
  s.w.data = s.data.data();
  s.w.format = WeightFormat::kBF16;
  s.w.rows = w.rows;
  s.w.cols = w.cols;
  return s;
}

// Runs a test body on the AVX-512 kernels (those that pin down their own bits; AMX sums bf16
// weights in another order, matmul_amx_test.cc), restoring the instruction set after.
class Avx512Only {
 public:
  Avx512Only() : saved_(MatMulIsa()), ok_(SetMatMulIsa(Isa::kAvx512)) {}
  ~Avx512Only() { SetMatMulIsa(saved_); }
  bool ok() const { return ok_; }

 private:
  Isa saved_;
  bool ok_;
};

class MatMulTest : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(MatMulTest, MatchesDoubleReference) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 7, 64},
                         {3, 33, 96},
                         {9, 128, 320},
                         {2, 5, 4096}}) {
    const Stored s = MakeWeight(GetParam(), n, k, 11);
    const std::vector<float> x = testing::RandomVector(m * k, 12);
    std::vector<float> y(m * n);
    MatMul(y.data(), x.data(), s.w, m);
    std::vector<double> ref(m * n, 0.0);
    double scale = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < k; ++c) {
          ref[i * n + j] += static_cast<double>(x[i * k + c]) * s.dense[j * k + c];
          scale = std::max(scale, std::fabs(x[i * k + c] * s.dense[j * k + c]));
        }
      }
    }
    // fp32 accumulation of k products: error grows like sqrt(k) eps * max term; 4 k eps bounds it.
    const double tol = 4.0 * k * 1.2e-7 * scale;
    for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(y[i], ref[i], tol) << m << "x" << n << "x" << k;
  }
}

TEST_P(MatMulTest, RowResultDoesNotDependOnBatch) {
  const int64_t n = 40, k = 256;
  const Stored s = MakeWeight(GetParam(), n, k, 5);
  const std::vector<float> x = testing::RandomVector(7 * k, 6);
  std::vector<float> batch(7 * n), alone(n);
  MatMul(batch.data(), x.data(), s.w, 7);
  for (int64_t i = 0; i < 7; ++i) {
    MatMul(alone.data(), x.data() + i * k, s.w, 1);
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], batch[i * n + j]);  // bitwise
  }
}

TEST_P(MatMulTest, DequantizeRowIsTheStoredValue) {
  const Stored s = MakeWeight(GetParam(), 3, 64, 9);
  std::vector<float> row(64);
  for (int64_t r = 0; r < 3; ++r) {
    DequantizeRow(row.data(), s.w, r);
    for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(row[c], static_cast<float>(s.dense[r * 64 + c]));
  }
}

// Every instruction set the machine has, and every thread count, gives the same bits for every
// shape (tile remainders in m and n, K tails, several x blocks, and on AVX-512 K in slices with the
// lane sums kept between them: 70 x 3077 and 70 x 4096); scalar may differ (no FMA).
TEST_P(MatMulTest, IsasThreadsAndBatchesAgreeBitwise) {
  const Isa saved = MatMulIsa();
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 37, 7},
                         {5, 19, 33},
                         {13, 70, 96},
                         {70, 29, 1000},
                         {130, 9, 1024},
                         {3, 4, 2048},
                         {70, 133, 3077},
                         {70, 40, 4096}}) {
    if (GetParam() == WeightFormat::kMxfp4 && k % 32 != 0) continue;
    const Stored s = MakeWeight(GetParam(), n, k, 21);
    const std::vector<float> x = testing::RandomVector(m * k, 22);
    std::vector<float> first;
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
      if (!SetMatMulIsa(isa)) continue;
      for (int threads : {1, 2, 3}) {
        ThreadPool::Global().SetActiveThreads(threads);
        std::vector<float> y(m * n), row(n);
        MatMul(y.data(), x.data(), s.w, m);
        if (isa == Isa::kScalar) continue;  // checked against the reference above
        if (first.empty()) first = y;
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_EQ(y[i], first[i]) << IsaName(isa) << " threads " << threads << " " << m << "x"
                                    << n << "x" << k << " at " << i;
        }
        for (int64_t i = 0; i < m; i += 7) {
          MatMul(row.data(), x.data() + i * k, s.w, 1);
          for (int64_t j = 0; j < n; ++j) ASSERT_EQ(row[j], first[i * n + j]);
        }
      }
    }
    first.clear();
  }
  ThreadPool::Global().SetActiveThreads(0);
  SetMatMulIsa(saved);
}

TEST_P(MatMulTest, EveryIsaMatchesDoubleReference) {
  const Isa saved = MatMulIsa();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    for (auto [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 9, 64}, {6, 11, 160}, {2, 3, 1024}}) {
      const Stored s = MakeWeight(GetParam(), n, k, 31);
      const std::vector<float> x = testing::RandomVector(m * k, 32);
      std::vector<float> y(m * n);
      MatMul(y.data(), x.data(), s.w, m);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0.0, scale = 0.0;
          for (int64_t c = 0; c < k; ++c) {
            ref += static_cast<double>(x[i * k + c]) * s.dense[j * k + c];
            scale = std::max(scale, std::fabs(x[i * k + c] * s.dense[j * k + c]));
          }
          ASSERT_NEAR(y[i * n + j], ref, 4.0 * k * 1.2e-7 * scale) << IsaName(isa);
        }
      }
    }
  }
  SetMatMulIsa(saved);
}

// Every packed layout (kernels/cpu/pack.h) holds the same values and gives the same bits, on every
// instruction set. The shapes reach every tile: 1..13 x rows (every strip, every count of row
// pairs and an odd last row), 37 and 70 rows (several 16-row calls of the lane-major TwoRowTile;
// at K = 1024, two blocks of x rows), 1..17 groups of rows (tiles of 2..8 groups and each narrower
// one), one to 32 blocks of columns. On AVX-512, 21, 37 and 64 rows take the group strips (x fits
// StripsFit's bound) and 40 rows at K = 4096 and 70 rows take Tile<4, 4> (MXFP4 at 70 rows and K
// up to 1024 through its fp32 panel of 16 decoded rows: 16 and 48 rows, one chunk and a part).
TEST_P(MatMulTest, PackedEqualsUnpackedBitwise) {
  const Isa saved = MatMulIsa();
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 64, 256},   {3, 24, 1024}, {37, 40, 96},  {70, 16, 64},
      {70, 48, 1024}, {21, 24, 512}, {64, 16, 512}, {40, 16, 4096}};
  for (int64_t m = 1; m <= 13; ++m) shapes.push_back({m, 136, 64});
  for (int64_t groups = 1; groups <= 9; ++groups) shapes.push_back({2, groups * kPackRows, 32});
  // One row at K >= 2048, where bf16 takes three groups at a time in chunks of K: whole chunks and
  // a last partial one; enough groups that the threads' ranges hold three or more, and counts that
  // leave none, one or two over.
  for (int64_t groups : {1, 2, 61, 64}) {
    shapes.push_back({1, groups * kPackRows, 2048 + 32 * (groups % 2)});
  }
  for (const PackLayout layout : {PackLayout::kBlocks, PackLayout::kLanes, PackLayout::kPairs}) {
    for (auto [m, n, k] : shapes) {
      const Stored s = MakeWeight(GetParam(), n, k, 41);
      Stored p = MakeWeight(GetParam(), n, k, 41);
      PackInPlace(&p.w, layout);
      ASSERT_EQ(p.w.packed, CanPack(s.w, layout));
      if (p.w.packed) {
        ASSERT_EQ(p.w.layout, layout);
      }
      std::vector<float> row(k), prow(k);
      for (int64_t r = 0; r < n; r += 5) {
        DequantizeRow(row.data(), s.w, r);
        DequantizeRow(prow.data(), p.w, r);
        ASSERT_EQ(row, prow) << "row " << r;
      }
      const std::vector<float> x = testing::RandomVector(m * k, 42);
      for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
        if (!SetMatMulIsa(isa)) continue;
        std::vector<float> y(m * n), py(m * n);
        MatMul(y.data(), x.data(), s.w, m);
        MatMul(py.data(), x.data(), p.w, m);
        ASSERT_EQ(y, py) << IsaName(isa) << " " << m << "x" << n << "x" << k << " layout "
                         << static_cast<int>(p.w.layout);
        // A view of whole groups (as MLA takes W_UV) reads the same rows.
        if (p.w.packed && n >= 2 * kPackRows) {
          std::vector<float> v(m * kPackRows);
          MatMul(v.data(), x.data(), p.w.Rows(kPackRows, kPackRows), m);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < kPackRows; ++j)
              ASSERT_EQ(v[i * kPackRows + j], y[i * n + kPackRows + j]);
          }
        }
      }
    }
  }
  SetMatMulIsa(saved);
}

// Packing is undone exactly (what the CUDA loader uploads), for every layout and for views.
TEST(Pack, CopyRowMajorUndoesEveryLayout) {
  for (const WeightFormat f : {WeightFormat::kBF16, WeightFormat::kMxfp4}) {
    for (const PackLayout layout :
         {PackLayout::kBlocks, PackLayout::kLanes, PackLayout::kPairs, PackLayout::kTiles}) {
      if (!LayoutFits(layout, f)) continue;
      const int64_t group = PackGroupRows(layout);
      const Stored s = MakeWeight(f, 3 * group, 96, 7);
      Stored p = MakeWeight(f, 3 * group, 96, 7);
      PackInPlace(&p.w, layout);
      ASSERT_TRUE(p.w.packed);
      const int64_t data_bytes =
          f == WeightFormat::kBF16 ? s.w.rows * s.w.cols * 2 : s.w.rows * s.w.cols / 2;
      const int64_t scale_bytes = f == WeightFormat::kMxfp4 ? s.w.rows * s.w.cols / 32 : 0;
      const auto* packed = static_cast<const uint8_t*>(p.w.data);
      const auto* original = static_cast<const uint8_t*>(s.w.data);
      ASSERT_FALSE(std::equal(packed, packed + data_bytes, original));  // the layout did change
      std::vector<uint8_t> data(data_bytes), scales(scale_bytes);
      CopyRowMajor(p.w, data.data(), scales.data());
      EXPECT_TRUE(std::equal(data.begin(), data.end(), original));
      if (scale_bytes) {
        EXPECT_TRUE(std::equal(scales.begin(), scales.end(), s.w.scales));
      }
      const Weight view = p.w.Rows(group, group);
      std::vector<uint8_t> vdata(data_bytes / 3), vscales(scale_bytes / 3);
      CopyRowMajor(view, vdata.data(), vscales.data());
      EXPECT_TRUE(std::equal(vdata.begin(), vdata.end(), original + data_bytes / 3));
    }
  }
}

// bf16 activations (opt-in): against float64 on the bf16-rounded x (the products are then exact,
// only the fp32 accumulation rounds), and bit for bit the same alone, batched, packed or not, on
// any thread count.
TEST(MatMul, Bf16ActivationsAreAccurateAndBatchInvariant) {
  const Avx512Only avx512;
  if (!avx512.ok() || !HasBf16DotProduct()) GTEST_SKIP() << "no AVX-512 BF16 on this machine";
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 24, 64},
                         {7, 40, 100},
                         {70, 16, 1024},
                         {5, 33, 4096},
                         // packed, 2-16 rows: the group kernels (strips of three, then two or one)
                         {2, 8, 32},
                         {3, 24, 128},
                         {8, 32, 256},
                         {16, 16, 512},
                         // packed, 17-64 rows: the group kernels while x fits StripsFit's bound
                         // (20 and 64 rows at K = 512), TileBf16 above it (40 rows at K = 4096)
                         {20, 24, 512},
                         {64, 16, 512},
                         {40, 16, 4096},
                         // packed, one row, K >= 2048: three groups at a time in chunks of K
                         {1, 512, 2048},
                         {1, 488, 2080}}) {
    const Stored s = MakeWeight(WeightFormat::kBF16, n, k, 51);
    Stored p = MakeWeight(WeightFormat::kBF16, n, k, 51);
    PackInPlace(&p.w, PackLayout::kBlocks);
    const std::vector<float> x = testing::RandomVector(m * k, 52);
    std::vector<float> y(m * n), py(m * n), row(n);
    {
      ActivationScope bf16(ActivationDtype::kBf16);
      MatMul(y.data(), x.data(), s.w, m);
      MatMul(py.data(), x.data(), p.w, m);
      ThreadPool::Global().SetActiveThreads(1);
      for (int64_t i = 0; i < m; i += 3) {
        MatMul(row.data(), x.data() + i * k, s.w, 1);
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(row[j], y[i * n + j]) << m << "x" << n << "x" << k;
      }
      ThreadPool::Global().SetActiveThreads(0);
    }
    ASSERT_EQ(y, py);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0.0, scale = 0.0;
        for (int64_t c = 0; c < k; ++c) {
          const double xb = Bf16ToF32(F32ToBf16(x[i * k + c]));
          ref += xb * s.dense[j * k + c];
          scale = std::max(scale, std::fabs(xb * s.dense[j * k + c]));
        }
        ASSERT_NEAR(y[i * n + j], ref, 4.0 * k * 1.2e-7 * scale);
      }
    }
    // Outside the scope the fp32 path is back.
    std::vector<float> f32(m * n);
    MatMul(f32.data(), x.data(), s.w, m);
    ASSERT_NE(f32, y);
  }
}

// The bf16 path's activation rounding (vectorised) is F32ToBf16 on every bit pattern class: ties,
// subnormals, infinities, NaNs (kept quiet), values rounding up to infinity; then zero padding.
TEST(MatMul, Bf16ActivationRoundingIsF32ToBf16) {
  constexpr int64_t k = 4099, kp = 4128;  // an odd tail after the vector loop
  std::mt19937 rng(5);
  std::vector<float> x(k);
  for (int64_t c = 0; c < k; ++c) {
    uint32_t bits = rng();
    switch (c % 8) {
      case 0:
        bits = (bits & 0xffff0000u) | 0x8000u;
        break;  // exact tie
      case 1:
        bits &= 0x807fffffu;
        break;  // subnormal or zero
      case 2:
        bits = (bits & 0x80000000u) | 0x7f800000u;
        break;  // infinity
      case 3:
        bits |= 0x7f800001u;
        break;  // NaN (quiet or not)
      case 4:
        bits = (bits & 0x80000000u) | 0x7f7fffffu;
        break;  // rounds up to infinity
      default:
        break;
    }
    std::memcpy(&x[c], &bits, 4);
  }
  std::vector<uint16_t> xb(kp, 0xffff);
  matmul_internal::RoundRowToBf16(xb.data(), x.data(), k, kp);
  for (int64_t c = 0; c < k; ++c) ASSERT_EQ(xb[c], F32ToBf16(x[c])) << "element " << c;
  for (int64_t c = k; c < kp; ++c) ASSERT_EQ(xb[c], 0) << "padding " << c;
}

// MXFP4 weights on the bf16 path (opt-in): every E2M1 x 2^(s - 127) is exact in bf16, so an MXFP4
// product there must be, bit for bit, the product of a bf16 weight holding the dequantized values
// (whose accuracy and batch invariance the test above checks) -- packed or not, alone or batched,
// on one thread or all. Shapes cover the strips that decode in their loop (one to three x rows
// against the whole group; from four, strips of four against each half, with 5 / 6 / 7 rows
// leaving one / two / three), more than 16 rows (decoded once per group), and an unpacked weight
// whose last group is partial (33 rows).
TEST(MatMul, Mxfp4OnBf16PathIsItsBf16Dequantization) {
  const Avx512Only avx512;
  if (!avx512.ok() || !HasBf16DotProduct()) GTEST_SKIP() << "no AVX-512 BF16 on this machine";
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 24, 64},
                         {2, 8, 32},
                         {3, 24, 128},
                         {4, 32, 256},
                         {5, 16, 64},
                         {6, 8, 96},
                         {7, 24, 128},
                         {8, 40, 256},
                         {16, 16, 512},
                         {40, 64, 256},
                         {5, 33, 96}}) {
    const Stored mx = MakeWeight(WeightFormat::kMxfp4, n, k, 61);
    Stored packed = MakeWeight(WeightFormat::kMxfp4, n, k, 61);
    PackInPlace(&packed.w);
    ASSERT_EQ(packed.w.packed, n % kPackRows == 0);
    const Stored bf = Bf16Copy(mx.w);
    for (int64_t i = 0; i < n * k; ++i) {
      uint16_t h;
      std::memcpy(&h, &bf.data[2 * i], 2);
      ASSERT_EQ(Bf16ToF32(h), bf.dense[i])
          << "not exact in bf16: row " << i / k << " col " << i % k;
    }
    const std::vector<float> x = testing::RandomVector(m * k, 62);
    std::vector<float> want(m * n), got(m * n), got_packed(m * n), alone(n);
    ActivationScope bf16(ActivationDtype::kBf16);
    MatMul(want.data(), x.data(), bf.w, m);
    MatMul(got.data(), x.data(), mx.w, m);
    MatMul(got_packed.data(), x.data(), packed.w, m);
    ASSERT_EQ(got, want) << m << "x" << n << "x" << k;
    ASSERT_EQ(got_packed, want) << m << "x" << n << "x" << k;
    ThreadPool::Global().SetActiveThreads(1);
    for (int64_t i = 0; i < m; i += 3) {
      MatMul(alone.data(), x.data() + i * k, packed.w, 1);
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(alone[j], want[i * n + j]) << m << "x" << n << "x" << k << " row " << i;
      }
    }
    ThreadPool::Global().SetActiveThreads(0);
  }
}

// Every code under every scale on the bf16 path (x the identity, as above): the bf16 copy of the
// dequantized weight gives the same bits, NaN rows and the flushed 2^-128 of scale 0 included.
TEST(MatMul, Mxfp4OnBf16PathDecodesEveryCodeAndScale) {
  if (!HasBf16DotProduct()) GTEST_SKIP() << "no AVX-512 BF16 on this machine";
  const Stored mx = EveryCodeEveryScale();
  const int64_t kRows = mx.w.rows, kCols = mx.w.cols;
  const Stored bf = Bf16Copy(mx.w);
  Stored packed = mx;
  packed.w.data = packed.data.data();
  packed.w.scales = packed.scales.data();
  PackInPlace(&packed.w, PackLayout::kBlocks);
  ActivationScope bf16(ActivationDtype::kBf16);
  for (int64_t m : {int64_t{1}, int64_t{3}, kCols}) {
    std::vector<float> x(m * kCols, 0.0f), want(m * kRows), got(m * kRows), got_packed(m * kRows);
    for (int64_t i = 0; i < m; ++i) x[i * kCols + i] = 1.0f;
    MatMul(want.data(), x.data(), bf.w, m);
    MatMul(got.data(), x.data(), mx.w, m);
    MatMul(got_packed.data(), x.data(), packed.w, m);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "m " << m;
    ASSERT_EQ(std::memcmp(got_packed.data(), want.data(), want.size() * 4), 0) << "m " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MatMulTest,
                         ::testing::Values(WeightFormat::kF32, WeightFormat::kBF16,
                                           WeightFormat::kF16, WeightFormat::kMxfp4));

TEST(MatMul, StridedOutputAndInput) {
  const Stored s = MakeWeight(WeightFormat::kBF16, 6, 32, 1);
  const std::vector<float> x = testing::RandomVector(2 * 40, 2);
  std::vector<float> y(2 * 10, -1.0f), dense(2 * 6);
  MatMul(y.data(), 10, x.data(), 40, s.w, 2);
  std::vector<float> xd(2 * 32);
  for (int i = 0; i < 2; ++i) std::copy_n(&x[i * 40], 32, &xd[i * 32]);
  MatMul(dense.data(), xd.data(), s.w, 2);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 6; ++j) EXPECT_EQ(y[i * 10 + j], dense[i * 6 + j]);
    for (int j = 6; j < 10; ++j) EXPECT_EQ(y[i * 10 + j], -1.0f);  // untouched
  }
}

// The accounting kimi-bench reads: bytes, flops and reads per target, and one timed entry per call
// with its shape and whether it ran nested in a parallel job. Nothing is recorded once removed.
TEST(MatMul, StatsRecordEveryCallWithItsShape) {
  const Stored a = MakeWeight(WeightFormat::kBF16, 24, 64, 1);
  const Stored b = MakeWeight(WeightFormat::kMxfp4, 8, 64, 2);
  const std::vector<float> x = testing::RandomVector(3 * 64, 3);
  std::vector<float> ya(3 * 24), yb(3 * 8);
  MatMulStats stats;
  SetMatMulStats(&stats);
  MatMul(ya.data(), x.data(), a.w, 3);
  const MatMulTarget both[] = {{ya.data(), 24, &a.w}, {yb.data(), 8, &b.w}};
  MatMulMany(both, x.data(), 64, 2);
  ThreadPool two(2);  // a parallel section on any machine, one core or many
  two.ParallelForChunks(2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i == 0) MatMul(yb.data(), x.data(), b.w, 1);
    }
  });
  SetMatMulStats(nullptr);
  MatMul(ya.data(), x.data(), a.w, 3);  // not recorded

  EXPECT_EQ(stats.calls, 4);  // targets
  EXPECT_EQ(stats.weight_bytes, 2 * a.w.Bytes() + 2 * b.w.Bytes());
  EXPECT_EQ(stats.flops, 2 * (3 * 24 * 64 + 2 * 24 * 64 + 2 * 8 * 64 + 1 * 8 * 64));
  ASSERT_EQ(stats.reads.size(), 4u);
  EXPECT_EQ(stats.reads[1].data, a.w.data);
  EXPECT_EQ(stats.reads[2].data, b.w.data);
  ASSERT_EQ(stats.timed.size(), 3u);
  const MatMulStats::Call& one = stats.timed[0];
  EXPECT_EQ(one.m, 3);
  EXPECT_EQ(one.rows, 24);
  EXPECT_EQ(one.cols, 64);
  EXPECT_EQ(one.bytes, a.w.Bytes());
  EXPECT_EQ(one.targets, 1);
  EXPECT_EQ(one.format, WeightFormat::kBF16);
  EXPECT_FALSE(one.nested);
  const MatMulStats::Call& many = stats.timed[1];
  EXPECT_EQ(many.m, 2);
  EXPECT_EQ(many.rows, 32);
  EXPECT_EQ(many.bytes, a.w.Bytes() + b.w.Bytes());
  EXPECT_EQ(many.targets, 2);
  EXPECT_FALSE(many.nested);
  const MatMulStats::Call& inner = stats.timed[2];
  EXPECT_EQ(inner.m, 1);
  EXPECT_EQ(inner.format, WeightFormat::kMxfp4);
  EXPECT_TRUE(inner.nested);
  for (const MatMulStats::Call& c : stats.timed) EXPECT_GT(c.seconds, 0.0);
}

// Every E2M1 code under every E8M0 scale (NaN at 255, 2^-127 at 0) decodes to the exact product on
// every kernel path: one x row (the batch-1 stream), a few (dot-product tiles) and many (the
// panel), unpacked and in every packed layout. x is the identity, so y[c, r] is weight (r, c)
// itself; a zero's sign is not compared (an FMA chain from +0 cannot keep it).
TEST(MatMul, Mxfp4DecodesEveryCodeAndScaleExactly) {
  const Stored all = EveryCodeEveryScale();  // row r: scale byte r
  const int64_t kRows = all.w.rows, kCols = all.w.cols;
  const auto expected = [&](int64_t r, int64_t c) {
    const uint8_t byte = all.data[r * kCols / 2 + c / 2];
    const int code = c % 2 == 0 ? byte & 0xf : byte >> 4;
    // Scale 255 is NaN; from 253 up, +-6 * 2^(scale - 127) overflows to infinity, and the zeros of
    // x times it make every output of the row NaN.
    return r >= 253 ? std::nan("") : E2m1(code) * std::ldexp(1.0, static_cast<int>(r) - 127);
  };
  const Isa saved = MatMulIsa();
  for (int layout = 0; layout < 4; ++layout) {  // not packed, kBlocks, kLanes, kPairs
    const bool packed = layout > 0;
    Stored copy = all;
    Weight& w = copy.w;
    w.data = copy.data.data();
    w.scales = copy.scales.data();
    if (packed) PackInPlace(&w, static_cast<PackLayout>(layout - 1));
    ASSERT_EQ(w.packed, packed);
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
      if (!SetMatMulIsa(isa)) continue;
      for (int64_t m : {int64_t{1}, int64_t{3}, kCols}) {
        std::vector<float> x(m * kCols, 0.0f), y(m * kRows);
        for (int64_t i = 0; i < m; ++i) x[i * kCols + i] = 1.0f;
        MatMul(y.data(), x.data(), w, m);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t r = 0; r < kRows; ++r) {
            const double want = expected(r, i);
            const float got = y[i * kRows + r];
            if (std::isnan(want)) {
              ASSERT_TRUE(std::isnan(got)) << IsaName(isa) << " m " << m << " row " << r;
            } else {
              ASSERT_EQ(got, static_cast<float>(want))
                  << IsaName(isa) << " layout " << layout << " m " << m << " row " << r << " col "
                  << i;
            }
          }
        }
      }
    }
  }
  SetMatMulIsa(saved);
}

}  // namespace
}  // namespace kimi::cpu
