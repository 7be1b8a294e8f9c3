// MatMul kernels for AVX2 + FMA + F16C, chosen at run time on machines without AVX-512. The 16
// lanes of the canonical order (matmul_impl.h) are two 8-lane registers, so results equal the
// AVX-512 path bit for bit.
// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul_impl.h"
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")

namespace kimi::cpu::matmul_internal {
namespace {

#define KIMI_ALWAYS_INLINE inline __attribute__((always_inline))

struct V2 {
  __m256 lo, hi;  // lanes 0..7, 8..15
};

inline V2 Zero2() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }

struct Bf16Loader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE static void Split(const uint16_t* p, V2& e, V2& o) {
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    e = {_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
         _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16))};
    o = {_mm256_castsi256_ps(_mm256_and_si256(v0, mask)),
         _mm256_castsi256_ps(_mm256_and_si256(v1, mask))};
  }
  KIMI_ALWAYS_INLINE static void SplitHalf(const uint16_t* p, __m256& e, __m256& o) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    o = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, V2& e, V2& o) const {
    Split(base + r * k + b * 32, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadHalf(int64_t r, int64_t b, int h, __m256& e, __m256& o) const {
    SplitHalf(base + r * k + b * 32 + 16 * h, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t r, int64_t b, int rem, V2& e, V2& o) const {
    uint16_t buf[32] = {};
    std::memcpy(buf, base + r * k + b * 32, rem * sizeof(uint16_t));
    Split(buf, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int64_t r, int64_t b, int rem, int h, __m256& e,
                                       __m256& o) const {
    uint16_t buf[32] = {};
    std::memcpy(buf, base + r * k + b * 32, rem * sizeof(uint16_t));
    SplitHalf(buf + 16 * h, e, o);
  }
};

struct F16Loader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE static void Half(const uint16_t* p, __m256& e, __m256& o) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i even = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    const __m256i odd = _mm256_srli_epi32(v, 16);
    // packus interleaves per 128-bit lane: [e0-3 o0-3 | e4-7 o4-7] -> [e0-7 | o0-7].
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(even, odd), 0xd8);
    e = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
    o = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
  }
  KIMI_ALWAYS_INLINE static void Split(const uint16_t* p, V2& e, V2& o) {
    Half(p, e.lo, o.lo);
    Half(p + 16, e.hi, o.hi);
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, V2& e, V2& o) const {
    Split(base + r * k + b * 32, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadHalf(int64_t r, int64_t b, int h, __m256& e, __m256& o) const {
    Half(base + r * k + b * 32 + 16 * h, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t r, int64_t b, int rem, V2& e, V2& o) const {
    uint16_t buf[32] = {};
    std::memcpy(buf, base + r * k + b * 32, rem * sizeof(uint16_t));
    Split(buf, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int64_t r, int64_t b, int rem, int h, __m256& e,
                                       __m256& o) const {
    uint16_t buf[32] = {};
    std::memcpy(buf, base + r * k + b * 32, rem * sizeof(uint16_t));
    Half(buf + 16 * h, e, o);
  }
};

struct F32Loader {
  const float* base;
  int64_t k;
  KIMI_ALWAYS_INLINE static void Half(const float* p, __m256& e, __m256& o) {
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    e = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    o = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
  }
  KIMI_ALWAYS_INLINE static void Split(const float* p, V2& e, V2& o) {
    Half(p, e.lo, o.lo);
    Half(p + 16, e.hi, o.hi);
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, V2& e, V2& o) const {
    Split(base + r * k + b * 32, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadHalf(int64_t r, int64_t b, int h, __m256& e, __m256& o) const {
    Half(base + r * k + b * 32 + 16 * h, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t r, int64_t b, int rem, V2& e, V2& o) const {
    float buf[32] = {};
    std::memcpy(buf, base + r * k + b * 32, rem * sizeof(float));
    Split(buf, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int64_t r, int64_t b, int rem, int h, __m256& e,
                                       __m256& o) const {
    float buf[32] = {};
    std::memcpy(buf, base + r * k + b * 32, rem * sizeof(float));
    Half(buf + 16 * h, e, o);
  }
};

struct Mxfp4Loader {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t k;
  // E2M1 magnitude from the low 3 bits (vpermps), sign from bit 3.
  KIMI_ALWAYS_INLINE static __m256 Decode(__m256i codes, __m256 table) {
    const __m256 mag = _mm256_permutevar8x32_ps(table, codes);
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(codes, 28),
                                          _mm256_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, V2& e, V2& o) const {
    const __m256 table =
        _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f),
                      _mm256_set1_ps(kE8m0[scales[r * (k / 32) + b]]));
    const uint8_t* p = packed + r * (k / 2) + b * 16;
    const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i c1 =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    e = {Decode(c0, table), Decode(c1, table)};
    o = {Decode(_mm256_srli_epi32(c0, 4), table), Decode(_mm256_srli_epi32(c1, 4), table)};
  }
  KIMI_ALWAYS_INLINE static void DecodeHalf(const uint8_t* p, uint8_t scale, __m256& e, __m256& o) {
    const __m256 table =
        _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f),
                      _mm256_set1_ps(kE8m0[scale]));
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    e = Decode(c, table);
    o = Decode(_mm256_srli_epi32(c, 4), table);
  }
  KIMI_ALWAYS_INLINE void LoadHalf(int64_t r, int64_t b, int h, __m256& e, __m256& o) const {
    DecodeHalf(packed + r * (k / 2) + b * 16 + 8 * h, scales[r * (k / 32) + b], e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, V2& e, V2& o) const {  // k % 32 == 0
    e = Zero2();
    o = Zero2();
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int64_t, int64_t, int, int, __m256& e, __m256& o) const {
    e = _mm256_setzero_ps();
    o = _mm256_setzero_ps();
  }
};

struct Bf16PackedLoader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE const uint16_t* At(int64_t r, int64_t b) const {
    return base + (r / kPackRows) * kPackRows * k + b * 32 * kPackRows + (r % kPackRows) * 32;
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, V2& e, V2& o) const {
    Bf16Loader::Split(At(r, b), e, o);
  }
  KIMI_ALWAYS_INLINE void LoadHalf(int64_t r, int64_t b, int h, __m256& e, __m256& o) const {
    Bf16Loader::SplitHalf(At(r, b) + 16 * h, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, V2& e, V2& o) const {
    e = Zero2();
    o = Zero2();
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int64_t, int64_t, int, int, __m256& e, __m256& o) const {
    e = _mm256_setzero_ps();
    o = _mm256_setzero_ps();
  }
};

struct Mxfp4PackedLoader {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t k;
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, V2& e, V2& o) const {
    const int64_t g = r / kPackRows, j = r % kPackRows;
    const uint8_t s = scales[g * kPackRows * (k / 32) + b * kPackRows + j];
    const __m256 table = _mm256_mul_ps(
        _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), _mm256_set1_ps(kE8m0[s]));
    const uint8_t* p = packed + g * kPackRows * (k / 2) + b * 16 * kPackRows + j * 16;
    const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i c1 =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    e = {Mxfp4Loader::Decode(c0, table), Mxfp4Loader::Decode(c1, table)};
    o = {Mxfp4Loader::Decode(_mm256_srli_epi32(c0, 4), table),
         Mxfp4Loader::Decode(_mm256_srli_epi32(c1, 4), table)};
  }
  KIMI_ALWAYS_INLINE void LoadHalf(int64_t r, int64_t b, int h, __m256& e, __m256& o) const {
    const int64_t g = r / kPackRows, j = r % kPackRows;
    Mxfp4Loader::DecodeHalf(packed + g * kPackRows * (k / 2) + b * 16 * kPackRows + j * 16 + 8 * h,
                            scales[g * kPackRows * (k / 32) + b * kPackRows + j], e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, V2& e, V2& o) const {
    e = Zero2();
    o = Zero2();
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int64_t, int64_t, int, int, __m256& e, __m256& o) const {
    e = _mm256_setzero_ps();
    o = _mm256_setzero_ps();
  }
};

KIMI_ALWAYS_INLINE float Reduce(V2 a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

template <int MR, int NR, class L>
inline void Tile(const L& l, const float* xp, int64_t kp, float* y, int64_t ldy, int64_t n,
                 int64_t full, int rem) {
  V2 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = Zero2();
  }
  const auto step = [&](const V2* we, const V2* wo, int64_t b) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const float* x = xp + i * kp + b * 32;
      const V2 xe{_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)};
      const V2 xo{_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        acc[i][j].lo = _mm256_fmadd_ps(xe.lo, we[j].lo, acc[i][j].lo);
        acc[i][j].hi = _mm256_fmadd_ps(xe.hi, we[j].hi, acc[i][j].hi);
        acc[i][j].lo = _mm256_fmadd_ps(xo.lo, wo[j].lo, acc[i][j].lo);
        acc[i][j].hi = _mm256_fmadd_ps(xo.hi, wo[j].hi, acc[i][j].hi);
      }
    }
  };
  for (int64_t b = 0; b < full; ++b) {
    V2 we[NR], wo[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) l.Load(n + j, b, we[j], wo[j]);
    step(we, wo, b);
  }
  if (rem) {
    V2 we[NR], wo[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) l.LoadTail(n + j, full, rem, we[j], wo[j]);
    step(we, wo, full);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = Reduce(acc[i][j]);
  }
}

// Blocked path (m >= 2): the 16 canonical lanes are two independent 8-lane halves (lane j < 8
// takes elements 2j, 2j + 1 of each 32-block: the block's first 16 elements; lanes 8..15 its last
// 16), so a tile runs K twice, once per half, each accumulator one register. MR x NR accumulators
// + 2 NR weight registers + 2 for x fit AVX2's 16 registers without spilling (the two-register
// tiles of the m == 1 path do not, once a weight row feeds more than one x row).
template <int MR, int NR, class L>
KIMI_ALWAYS_INLINE void HalfPass(const L& l, const float* xp, int64_t kp, int64_t n, int64_t full,
                                 int rem, int h, __m256 (&acc)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const auto step = [&](int64_t b, bool tail) {
    __m256 we[NR], wo[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if (tail) {
        l.LoadTailHalf(n + j, b, rem, h, we[j], wo[j]);
      } else {
        l.LoadHalf(n + j, b, h, we[j], wo[j]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float* x = xp + i * kp + b * 32 + 8 * h;
      __m256 xe = _mm256_loadu_ps(x), xo = _mm256_loadu_ps(x + 16);
      // Keep x in registers: GCC otherwise folds the load into each of the NR FMAs that use it,
      // and the extra loads cost about a quarter of the tile's speed on Zen 3.
      __asm__("" : "+x"(xe));
      __asm__("" : "+x"(xo));
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm256_fmadd_ps(xe, we[j], acc[i][j]);
        acc[i][j] = _mm256_fmadd_ps(xo, wo[j], acc[i][j]);
      }
    }
  };
  for (int64_t b = 0; b < full; ++b) step(b, false);
  if (rem) step(full, true);
}

template <int MR, int NR, class L>
inline void HalfTile(const L& l, const float* xp, int64_t kp, float* y, int64_t ldy, int64_t n,
                     int64_t full, int rem) {
  __m256 acc[MR][NR];
  alignas(32) float lo[MR][NR][8];
  HalfPass<MR, NR>(l, xp, kp, n, full, rem, 0, acc);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) _mm256_store_ps(lo[i][j], acc[i][j]);
  }
  HalfPass<MR, NR>(l, xp, kp, n, full, rem, 1, acc);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = Reduce({_mm256_load_ps(lo[i][j]), acc[i][j]});
  }
}

template <int MR, class L>
inline void RowStrip(const L& l, const Problem& p, int64_t i0, int64_t n0, int64_t n1, int64_t full,
                     int rem) {
  const float* xp = p.xp + i0 * p.kp;
  float* y = p.y + i0 * p.ldy;
  int64_t n = n0;
  constexpr int NR = MR == 1 ? 4 : 2;  // MR * NR + 2 NR + 2 <= 16 registers
  for (; n + NR <= n1; n += NR) HalfTile<MR, NR>(l, xp, p.kp, y, p.ldy, n, full, rem);
  for (; n < n1; ++n) HalfTile<MR, 1>(l, xp, p.kp, y, p.ldy, n, full, rem);
}

constexpr int64_t kChunk = 16;  // W rows per chunk: 16 x K bf16 stays in L2 while strips pass

template <class L>
void RangeWith(const L& l, const Problem& p, int64_t n0, int64_t n1) {
  const int64_t k = p.w->cols, full = k / 32;
  const int rem = static_cast<int>(k % 32);
  if (p.m == 1) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) Tile<1, 4>(l, p.xp, p.kp, p.y, p.ldy, n, full, rem);
    for (; n < n1; ++n) Tile<1, 1>(l, p.xp, p.kp, p.y, p.ldy, n, full, rem);
    return;
  }
  // Blocks of x rows that stay in L2 while 16-row chunks of W (in L1/L2) pass every strip.
  int64_t mb = (int64_t{256} << 10) / (p.kp * 4);
  mb = mb < 4 ? 4 : mb & ~int64_t{3};
  for (int64_t i0 = 0; i0 < p.m; i0 += mb) {
    const int64_t i1 = i0 + mb < p.m ? i0 + mb : p.m;
    for (int64_t c0 = n0; c0 < n1; c0 += kChunk) {
      const int64_t c1 = c0 + kChunk < n1 ? c0 + kChunk : n1;
      int64_t i = i0;
      for (; i + 4 <= i1; i += 4) RowStrip<4>(l, p, i, c0, c1, full, rem);
      switch (i1 - i) {
        case 3:
          RowStrip<3>(l, p, i, c0, c1, full, rem);
          break;
        case 2:
          RowStrip<2>(l, p, i, c0, c1, full, rem);
          break;
        case 1:
          RowStrip<1>(l, p, i, c0, c1, full, rem);
          break;
        default:
          break;
      }
    }
  }
}

void Range(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  switch (w.format) {
    case WeightFormat::kBF16:
      if (w.packed) {
        RangeWith(Bf16PackedLoader{static_cast<const uint16_t*>(w.data), w.cols}, p, n0, n1);
      } else {
        RangeWith(Bf16Loader{static_cast<const uint16_t*>(w.data), w.cols}, p, n0, n1);
      }
      return;
    case WeightFormat::kF16:
      RangeWith(F16Loader{static_cast<const uint16_t*>(w.data), w.cols}, p, n0, n1);
      return;
    case WeightFormat::kF32:
      RangeWith(F32Loader{static_cast<const float*>(w.data), w.cols}, p, n0, n1);
      return;
    case WeightFormat::kMxfp4:
      if (w.packed) {
        RangeWith(Mxfp4PackedLoader{static_cast<const uint8_t*>(w.data), w.scales, w.cols}, p, n0,
                  n1);
      } else {
        RangeWith(Mxfp4Loader{static_cast<const uint8_t*>(w.data), w.scales, w.cols}, p, n0, n1);
      }
      return;
  }
}

}  // namespace

#pragma GCC pop_options

const Kernels* Avx2Kernels() {
  static const Kernels k{"avx2", &Range};
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok ? &k : nullptr;
}

}  // namespace kimi::cpu::matmul_internal
