// MatMul kernels for AVX2 + FMA + F16C, chosen at run time on machines without AVX-512. Results
// equal the AVX-512 path bit for bit: the summation order is the canonical one of matmul_impl.h.
//
// The 16 canonical lanes are two independent 8-lane halves (lane j < 8 takes elements 2j, 2j + 1
// of each 32-block, the block's first 16 elements; lanes 8..15 its last 16). Every kernel here
// walks K once per half with one register per accumulator, so tiles fit AVX2's 16 registers
// without spilling, and adds the halves in the final lane sum.
//
// Weights are addressed through row cursors (Rows): the address arithmetic of a packed layout
// (kernels/cpu/pack.h) is done once per tile, not per load; per load it cost as much issue
// bandwidth as the FMAs themselves on Zen 3.
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

// --- Converting 16 stored elements into the 8 even (e) and 8 odd (o) ones, as fp32 ------------

struct Bf16Split {
  using T = uint16_t;
  // A bf16 pair per 32-bit word: the even element in the low half.
  KIMI_ALWAYS_INLINE static void Apply(const uint16_t* p, __m256& e, __m256& o) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    // One load: GCC otherwise loads the 32 bytes again as the AND's memory operand (a third
    // fewer bytes per cycle in the batch-1 stream, measured).
    __asm__("" : "+x"(v));
    e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    o = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

struct F16Split {
  using T = uint16_t;
  KIMI_ALWAYS_INLINE static void Apply(const uint16_t* p, __m256& e, __m256& o) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i even = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    const __m256i odd = _mm256_srli_epi32(v, 16);
    // packus interleaves per 128-bit lane: [e0-3 o0-3 | e4-7 o4-7] -> [e0-7 | o0-7].
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(even, odd), 0xd8);
    e = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
    o = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
  }
};

struct F32Split {
  using T = float;
  KIMI_ALWAYS_INLINE static void Apply(const float* p, __m256& e, __m256& o) {
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    e = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    o = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
  }
};

// 8 code bytes (16 E2M1 values, the even one in the low nibble) times 2^(scale - 127): magnitude
// from the low 3 bits (vpermps over a scaled table), sign from bit 3.
KIMI_ALWAYS_INLINE void DecodeMxfp4(const uint8_t* p, uint8_t scale, __m256& e, __m256& o) {
  const __m256 table = _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f),
                                     _mm256_set1_ps(kE8m0[scale]));
  const __m256i sign_bit = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i c_odd = _mm256_srli_epi32(c, 4);
  e = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, c),
                    _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 28), sign_bit)));
  o = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, c_odd),
                    _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c_odd, 28), sign_bit)));
}

// --- Row cursors: rows r + j of a weight, for small constant j --------------------------------
// LoadHalf(j, b, h, e, o): elements [32b + 16h, 32b + 16h + 16) of row r + j, split even / odd.
// LoadTailHalf: the same for the last, partial block (rem < 32 elements, zero-filled).
// Packed cursors need r % kPackRows + j < kPackRows (the tiles keep to their group).

template <class S>
struct DenseRows {
  using T = typename S::T;
  const T* p;  // row r
  int64_t k;
  KIMI_ALWAYS_INLINE void LoadHalf(int j, int64_t b, int h, __m256& e, __m256& o) const {
    S::Apply(p + j * k + b * 32 + 16 * h, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int j, int64_t b, int rem, int h, __m256& e,
                                       __m256& o) const {
    T buf[32] = {};
    std::memcpy(buf, p + j * k + b * 32, rem * sizeof(T));
    S::Apply(buf + 16 * h, e, o);
  }
};

struct Mxfp4Rows {
  const uint8_t* codes;   // row r: k / 2 bytes
  const uint8_t* scales;  // row r: k / 32 bytes
  int64_t k;
  KIMI_ALWAYS_INLINE void LoadHalf(int j, int64_t b, int h, __m256& e, __m256& o) const {
    DecodeMxfp4(codes + j * (k / 2) + b * 16 + 8 * h, scales[j * (k / 32) + b], e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int, int64_t, int, int, __m256& e, __m256& o) const {
    e = _mm256_setzero_ps();  // k % 32 == 0 for MXFP4
    o = _mm256_setzero_ps();
  }
};

// Packed layouts: block b of a group of kPackRows rows is one contiguous run of kPackRows rows'
// 32 elements each.
struct Bf16PackedRows {
  static constexpr bool kPacked = true;
  const uint16_t* p;  // row r's block 0
  KIMI_ALWAYS_INLINE void LoadHalf(int j, int64_t b, int h, __m256& e, __m256& o) const {
    Bf16Split::Apply(p + b * 32 * kPackRows + j * 32 + 16 * h, e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int, int64_t, int, int, __m256& e, __m256& o) const {
    e = _mm256_setzero_ps();  // packed: k % 32 == 0
    o = _mm256_setzero_ps();
  }
};

struct Mxfp4PackedRows {
  static constexpr bool kPacked = true;
  const uint8_t* codes;   // row r's block 0
  const uint8_t* scales;  // row r's block 0
  KIMI_ALWAYS_INLINE void LoadHalf(int j, int64_t b, int h, __m256& e, __m256& o) const {
    DecodeMxfp4(codes + b * 16 * kPackRows + j * 16 + 8 * h, scales[b * kPackRows + j], e, o);
  }
  KIMI_ALWAYS_INLINE void LoadTailHalf(int, int64_t, int, int, __m256& e, __m256& o) const {
    e = _mm256_setzero_ps();
    o = _mm256_setzero_ps();
  }
};

// --- Loaders: a weight, handing out row cursors ------------------------------------------------

template <class S>
struct DenseLoader {
  const typename S::T* base;
  int64_t k;
  KIMI_ALWAYS_INLINE DenseRows<S> Rows(int64_t r) const { return {base + r * k, k}; }
};

struct Mxfp4Loader {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t k;
  KIMI_ALWAYS_INLINE Mxfp4Rows Rows(int64_t r) const {
    return {codes + r * (k / 2), scales + r * (k / 32), k};
  }
};

struct Bf16PackedLoader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE Bf16PackedRows Rows(int64_t r) const {
    return {base + (r / kPackRows) * kPackRows * k + (r % kPackRows) * 32};
  }
};

struct Mxfp4PackedLoader {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t k;
  KIMI_ALWAYS_INLINE Mxfp4PackedRows Rows(int64_t r) const {
    const int64_t g = r / kPackRows, j = r % kPackRows;
    return {codes + g * kPackRows * (k / 2) + j * 16, scales + g * kPackRows * (k / 32) + j};
  }
};

template <class L>
concept PackedLoader = requires(const L& l) {
  decltype(l.Rows(0))::kPacked;
};

// --- Tiles ---------------------------------------------------------------------------------------

// The canonical lane sum of one output: lanes j + (j + 8) first, then + 4, + 2, + 1.
KIMI_ALWAYS_INLINE float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

// Half h of MR rows of xp against NR weight rows: acc[i][j] = lanes 8h..8h+7 of output (i, j).
// The NR weight rows are loaded and converted first and held while every x row uses them:
// MR * NR accumulators + 2 NR weights + 2 x registers.
template <int MR, int NR, class R>
KIMI_ALWAYS_INLINE void HalfPass(const R& w, const float* xp, int64_t kp, int64_t full, int rem,
                                 int h, __m256 (&acc)[MR][NR]) {
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
        w.LoadTailHalf(j, b, rem, h, we[j], wo[j]);
      } else {
        w.LoadHalf(j, b, h, we[j], wo[j]);
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

// y[i, n + j] for i < MR, j < NR: both halves, then the lane sums.
template <int MR, int NR, class R>
inline void HalfTile(const R& w, const float* xp, int64_t kp, float* y, int64_t ldy, int64_t n,
                     int64_t full, int rem) {
  __m256 acc[MR][NR];
  alignas(32) float lo[MR][NR][8];
  HalfPass<MR, NR>(w, xp, kp, full, rem, 0, acc);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) _mm256_store_ps(lo[i][j], acc[i][j]);
  }
  HalfPass<MR, NR>(w, xp, kp, full, rem, 1, acc);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = Reduce(_mm256_load_ps(lo[i][j]), acc[i][j]);
  }
}

// m == 1 on packed weights: a whole group of kPackRows rows per tile, read as one linear stream.
// Its 16 accumulators (kPackRows rows x two halves) do not fit beside x and the weights, so K is
// walked in segments of kSegment blocks (a few KiB, in L1): lanes 0..7 over the segment, then
// lanes 8..15 over the same bytes from L1, each half's sums kept in memory between segments.
// (Software prefetches ahead of the stream measured no faster on Zen 3: the hardware prefetcher
// follows a group's linear stream.)
constexpr int64_t kSegment = 16;

template <class R>
KIMI_ALWAYS_INLINE void GroupSegment(const R& w, const float* xp, int64_t b0, int64_t b1, int h,
                                     float (*sums)[8]) {
  __m256 acc[kPackRows];
#pragma GCC unroll 8
  for (int j = 0; j < kPackRows; ++j) acc[j] = _mm256_load_ps(sums[j]);
  for (int64_t b = b0; b < b1; ++b) {
    const __m256 xe = _mm256_loadu_ps(xp + b * 32 + 8 * h);
    const __m256 xo = _mm256_loadu_ps(xp + b * 32 + 16 + 8 * h);
#pragma GCC unroll 8
    for (int j = 0; j < kPackRows; ++j) {
      __m256 we, wo;
      w.LoadHalf(j, b, h, we, wo);
      acc[j] = _mm256_fmadd_ps(xe, we, acc[j]);
      acc[j] = _mm256_fmadd_ps(xo, wo, acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kPackRows; ++j) _mm256_store_ps(sums[j], acc[j]);
}

template <class R>
inline void GroupTile(const R& w, const float* xp, float* y, int64_t n, int64_t full) {
  alignas(32) float lo[kPackRows][8] = {};
  alignas(32) float hi[kPackRows][8] = {};
  for (int64_t b0 = 0; b0 < full; b0 += kSegment) {
    const int64_t b1 = b0 + kSegment < full ? b0 + kSegment : full;
    GroupSegment(w, xp, b0, b1, 0, lo);
    GroupSegment(w, xp, b0, b1, 1, hi);
  }
#pragma GCC unroll 8
  for (int j = 0; j < kPackRows; ++j) {
    y[n + j] = Reduce(_mm256_load_ps(lo[j]), _mm256_load_ps(hi[j]));
  }
}

// Rows [i0, i0 + MR) of the problem against W rows [n0, n1). NR divides kPackRows and every tile
// starts at a multiple of NR from n0 (a multiple of kPackRows): tiles stay inside packed groups.
template <int MR, class L>
inline void RowStrip(const L& l, const Problem& p, int64_t i0, int64_t n0, int64_t n1, int64_t full,
                     int rem) {
  const float* xp = p.xp + i0 * p.kp;
  float* y = p.y + i0 * p.ldy;
  int64_t n = n0;
  constexpr int NR = MR == 1 ? 4 : 2;  // MR * NR + 2 NR + 2 <= 16 registers
  for (; n + NR <= n1; n += NR) HalfTile<MR, NR>(l.Rows(n), xp, p.kp, y, p.ldy, n, full, rem);
  for (; n < n1; ++n) HalfTile<MR, 1>(l.Rows(n), xp, p.kp, y, p.ldy, n, full, rem);
}

constexpr int64_t kChunk = 16;  // W rows per chunk: 16 x K stays in L2 while the x strips pass

template <class L>
void RangeWith(const L& l, const Problem& p, int64_t n0, int64_t n1) {
  const int64_t k = p.w->cols, full = k / 32;
  const int rem = static_cast<int>(k % 32);
  if constexpr (PackedLoader<L>) {
    if (p.m == 1) {  // ranges start and end on group boundaries (kRowUnit rows, matmul.cc)
      for (int64_t n = n0; n < n1; n += kPackRows) GroupTile(l.Rows(n), p.xp, p.y, n, full);
      return;
    }
  }
  // Blocks of x rows that stay in L2 while chunks of W pass every strip of 4 rows.
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
  const int64_t k = w.cols;
  switch (w.format) {
    case WeightFormat::kBF16:
      if (w.packed) {
        RangeWith(Bf16PackedLoader{static_cast<const uint16_t*>(w.data), k}, p, n0, n1);
      } else {
        RangeWith(DenseLoader<Bf16Split>{static_cast<const uint16_t*>(w.data), k}, p, n0, n1);
      }
      return;
    case WeightFormat::kF16:
      RangeWith(DenseLoader<F16Split>{static_cast<const uint16_t*>(w.data), k}, p, n0, n1);
      return;
    case WeightFormat::kF32:
      RangeWith(DenseLoader<F32Split>{static_cast<const float*>(w.data), k}, p, n0, n1);
      return;
    case WeightFormat::kMxfp4: {
      const auto* codes = static_cast<const uint8_t*>(w.data);
      if (w.packed) {
        RangeWith(Mxfp4PackedLoader{codes, w.scales, k}, p, n0, n1);
      } else {
        RangeWith(Mxfp4Loader{codes, w.scales, k}, p, n0, n1);
      }
      return;
    }
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
