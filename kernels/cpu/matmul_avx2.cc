// MatMul kernels for AVX2 + FMA + F16C, chosen at run time on machines without AVX-512. Results
// equal the AVX-512 path bit for bit: the summation order is the canonical one of matmul_impl.h.
//
// Weights packed lane-major (kLanes, bf16 on these machines) go to matmul_avx2_lanes.cc at every m.
// For the other layouts, three kernels, by the number m of x rows:
//   m == 1 (decode), packed weights: GroupTile streams whole 8-row packed groups (MXFP4 packed
//   as kPairs decodes each code once there, both halves at a time: PairSegment);
//   m < kPanelMinM: dot-product tiles (HalfTile) of up to 4 x rows and 2-4 weight rows (kPairs
//   strips of 1-3 x rows: PairTile);
//   m >= kPanelMinM: W chunks converted to an fp32 panel, outer-product tiles (PanelTile).
// The first two use that the 16 canonical lanes are two independent 8-lane halves (lane j < 8
// takes elements 2j, 2j + 1 of each 32-block, the block's first 16 elements; lanes 8..15 its last
// 16): they walk K once per half with one register per accumulator, so tiles fit AVX2's 16
// registers without spilling, and add the halves in the final lane sum. All three perform the
// same fused multiply-adds per output in the same order.
//
// Weights are addressed through row cursors (Rows): the address arithmetic of a packed layout
// (kernels/cpu/pack.h) is done once per tile, not per load; per load it cost as much issue
// bandwidth as the FMAs themselves on Zen 3.
// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/pack.h"
#include <immintrin.h>

namespace kimi::cpu::matmul_internal {
namespace {

// The kPairs decode's tables (built here, before the AVX2 target region, because static
// initialisation runs on every machine). A decoded MXFP4 weight E2M1(code) * 2^(s - 127) has at
// most two significant bits, so as an fp32 its low 16 bits are zero (subnormal at s = 0, infinity
// and NaN at the top included): it is a bf16. bytes[s][0][c] and bytes[s][1][c] are the high and
// low byte of that bf16 for code c, with the bits DecodeMxfp4 produces (the product, then the
// sign).
struct Mxfp4ByteTables {
  alignas(32) uint8_t bytes[256][2][16];
  Mxfp4ByteTables() {
    for (int s = 0; s < 256; ++s) {
      for (int c = 0; c < 16; ++c) {
        const float v = kE2m1[c & 7] * kE8m0[s];
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        bits ^= static_cast<uint32_t>(c & 8) << 28;
        bytes[s][0][c] = static_cast<uint8_t>(bits >> 24);
        bytes[s][1][c] = static_cast<uint8_t>(bits >> 16);
      }
    }
  }
};
const Mxfp4ByteTables kMxfp4Bytes;

}  // namespace
}  // namespace kimi::cpu::matmul_internal

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#include "kernels/cpu/matmul_avx2_common.h"

namespace kimi::cpu::matmul_internal {
namespace {

using avx2::Bf16Split;
using avx2::WithRemainder;

// --- Converting 16 stored elements into the 8 even (e) and 8 odd (o) ones, as fp32 ------------

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

// kPairs MXFP4 (kernels/cpu/pack.h): 32 bytes hold one block of two rows, row 2p's codes in the
// low nibbles and row 2p + 1's in the high ones. Per row, two vpshufb look the 32 codes up in the
// scale's byte tables, and two in-lane byte unpacks plus a shift and a mask give the four vectors
// (half, parity) of canonical lanes -- about 2.5 vector operations per 8 weights, where
// DecodeMxfp4 takes 6.
KIMI_ALWAYS_INLINE __m256i PairRun(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// The 32 codes of the run's row with parity `odd`, one per byte.
KIMI_ALWAYS_INLINE __m256i PairCodes(__m256i run, int odd) {
  return _mm256_and_si256(odd ? _mm256_srli_epi16(run, 4) : run, _mm256_set1_epi8(0x0f));
}
// The 16 bf16 words of half h of the row (codes from PairCodes, scale byte s): even elements in
// the low halves of the 32-bit words.
KIMI_ALWAYS_INLINE __m256i PairWords(__m256i codes, uint8_t s, int h) {
  const auto* t = reinterpret_cast<const __m128i*>(kMxfp4Bytes.bytes[s]);
  const __m256i hi = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(t)), codes);
  const __m256i lo = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(t + 1)), codes);
  return h ? _mm256_unpackhi_epi8(lo, hi) : _mm256_unpacklo_epi8(lo, hi);
}
KIMI_ALWAYS_INLINE void WordsToF32(__m256i w, __m256& e, __m256& o) {
  e = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  o = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

struct Mxfp4PairsRows {
  static constexpr bool kPacked = true;
  const uint8_t* codes;   // the group's block 0
  const uint8_t* scales;  // the group's block 0
  int row;                // row r's index in its group
  KIMI_ALWAYS_INLINE void LoadHalf(int j, int64_t b, int h, __m256& e, __m256& o) const {
    const int r = row + j;
    const __m256i codes_r = PairCodes(PairRun(codes + b * 16 * kPackRows + (r / 2) * 32), r % 2);
    WordsToF32(PairWords(codes_r, scales[b * kPackRows + r], h), e, o);
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

struct Mxfp4PairsLoader {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t k;
  KIMI_ALWAYS_INLINE Mxfp4PairsRows Rows(int64_t r) const {
    const int64_t g = r / kPackRows;
    return {codes + g * kPackRows * (k / 2), scales + g * kPackRows * (k / 32),
            static_cast<int>(r % kPackRows)};
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

// kPairs MXFP4: block b of run `pair` (W rows 2 pair, 2 pair + 1) against MR x rows, both halves
// of the lanes: acc[i][parity][half] for W row 2 pair + parity. Each code is decoded once for all
// MR x rows, where HalfTile decodes every half of a row separately.
template <int MR>
KIMI_ALWAYS_INLINE void PairBlock(const Mxfp4PairsRows& w, int pair, int64_t b, const float* xp,
                                  int64_t kp, __m256 (&acc)[MR][2][2]) {
  const __m256i run = PairRun(w.codes + b * 16 * kPackRows + pair * 32);
#pragma GCC unroll 2
  for (int odd = 0; odd < 2; ++odd) {
    const __m256i codes = PairCodes(run, odd);
    const uint8_t s = w.scales[b * kPackRows + 2 * pair + odd];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 e, o;
      WordsToF32(PairWords(codes, s, h), e, o);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const float* x = xp + i * kp + b * 32 + 8 * h;  // even lanes 0..15, then odd lanes 0..15
        acc[i][odd][h] = _mm256_fmadd_ps(_mm256_loadu_ps(x), e, acc[i][odd][h]);
        acc[i][odd][h] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), o, acc[i][odd][h]);
      }
    }
  }
}

// GroupTile for kPairs: a pass over a segment takes two runs (rows 4q .. 4q + 3), both halves of
// their lanes, 8 accumulators.
KIMI_ALWAYS_INLINE void PairSegment(const Mxfp4PairsRows& w, const float* xp, int64_t b0,
                                    int64_t b1, int q, float (*lo)[8], float (*hi)[8]) {
  __m256 acc[2][1][2][2];  // [run][x row][parity][half]
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    acc[r / 2][0][r % 2][0] = _mm256_load_ps(lo[4 * q + r]);
    acc[r / 2][0][r % 2][1] = _mm256_load_ps(hi[4 * q + r]);
  }
  for (int64_t b = b0; b < b1; ++b) {
    PairBlock<1>(w, 2 * q, b, xp, 0, acc[0]);
    PairBlock<1>(w, 2 * q + 1, b, xp, 0, acc[1]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    _mm256_store_ps(lo[4 * q + r], acc[r / 2][0][r % 2][0]);
    _mm256_store_ps(hi[4 * q + r], acc[r / 2][0][r % 2][1]);
  }
}

inline void GroupTile(const Mxfp4PairsRows& w, const float* xp, float* y, int64_t n, int64_t full) {
  alignas(32) float lo[kPackRows][8] = {};
  alignas(32) float hi[kPackRows][8] = {};
  for (int64_t b0 = 0; b0 < full; b0 += kSegment) {
    const int64_t b1 = b0 + kSegment < full ? b0 + kSegment : full;
    // A line of the page kPageAheadBytes on, for its address translation (see TouchNextTile in
    // matmul_avx2_lanes.cc).
    _mm_prefetch(reinterpret_cast<const char*>(w.codes + b0 * 16 * kPackRows) + kPageAheadBytes,
                 _MM_HINT_T0);
    PairSegment(w, xp, b0, b1, 0, lo, hi);
    PairSegment(w, xp, b0, b1, 1, lo, hi);
  }
#pragma GCC unroll 8
  for (int j = 0; j < kPackRows; ++j) {
    y[n + j] = Reduce(_mm256_load_ps(lo[j]), _mm256_load_ps(hi[j]));
  }
}

// MR (1..3) x rows against one kPairs run (W rows n, n + 1, n even), 4 MR accumulators. Measured on
// Zen 3 (one thread, 256 x 256 and 4096 x 512): 1.5-2x HalfTile at m = 2 and 3; from 4 rows
// HalfTile<4, 2>, which shares each decode among 4 x rows, is as fast.
template <int MR>
inline void PairTile(const Mxfp4PairsRows& w, const float* xp, int64_t kp, float* y, int64_t ldy,
                     int64_t n, int64_t full) {
  __m256 acc[MR][2][2];  // [x row][parity][half]
#pragma GCC unroll 12
  for (int i = 0; i < 4 * MR; ++i) (&acc[0][0][0])[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < full; ++b) PairBlock<MR>(w, w.row / 2, b, xp, kp, acc);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) y[i * ldy + n + j] = Reduce(acc[i][j][0], acc[i][j][1]);
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
  if constexpr (MR <= 3 && std::is_same_v<L, Mxfp4PairsLoader>) {
    // Ranges of packed weights start and end on group boundaries, so n stays even.
    for (; n < n1; n += 2) PairTile<MR>(l.Rows(n), xp, p.kp, y, p.ldy, n, full);
    return;
  }
  constexpr int NR = MR == 1 ? 4 : 2;  // MR * NR + 2 NR + 2 <= 16 registers
  for (; n + NR <= n1; n += NR) HalfTile<MR, NR>(l.Rows(n), xp, p.kp, y, p.ldy, n, full, rem);
  for (; n < n1; ++n) HalfTile<MR, 1>(l.Rows(n), xp, p.kp, y, p.ldy, n, full, rem);
}

// --- Many x rows: outer-product tiles over an fp32 panel of W ------------------------------------
// With enough x rows to amortise it, a chunk of kPanelRows W rows is converted once into an fp32
// panel ordered by canonical lane: for lane J (0..15), block b and parity q (even, odd element),
// the kPanelRows values W[n0 + r, 32b + 2J + q] side by side. A tile then keeps 2 x 8 outputs of
// MR x rows per register (12 accumulators for MR = 6: twelve independent FMA chains, where the
// dot-product tiles above have eight) and builds lane J's partial sums for all of them, lane
// after lane; the canonical pairwise lane sum then runs on whole vectors. Every output sees the
// same fused multiply-adds in the same order as in the tiles above, so results are identical.
constexpr int64_t kPanelRows = 16;
constexpr int64_t kPanelMinM = 32;  // below this, converting the panel costs more than it saves

// c[t] = lane t of r[0..7] (an 8 x 8 transpose).
KIMI_ALWAYS_INLINE void Transpose8(const __m256 (&r)[8], __m256 (&c)[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    c[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The panel of W rows [n0, n0 + rows), rows <= kPanelRows (missing rows are zeros); nb blocks,
// the last one partial when rem > 0. Eight rows at a time: each row's 8 even (odd) elements of a
// half block are transposed into 8 lanes' vectors of 8 rows.
template <class L>
void PackPanel(const L& l, int64_t n0, int64_t rows, int64_t full, int rem, float* panel) {
  const int64_t nb = full + (rem ? 1 : 0);
  for (int64_t r0 = 0; r0 < kPanelRows; r0 += 8) {
    for (int64_t b = 0; b < nb; ++b) {
      for (int h = 0; h < 2; ++h) {
        __m256 e[8], o[8], te[8], to[8];
        for (int r = 0; r < 8; ++r) {
          if (r0 + r >= rows) {
            e[r] = o[r] = _mm256_setzero_ps();
          } else if (b < full) {
            l.Rows(n0 + r0 + r).LoadHalf(0, b, h, e[r], o[r]);
          } else {
            l.Rows(n0 + r0 + r).LoadTailHalf(0, b, rem, h, e[r], o[r]);
          }
        }
        Transpose8(e, te);
        Transpose8(o, to);
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
          const int64_t lane = 8 * h + t;
          _mm256_store_ps(panel + ((lane * nb + b) * 2 + 0) * kPanelRows + r0, te[t]);
          _mm256_store_ps(panel + ((lane * nb + b) * 2 + 1) * kPanelRows + r0, to[t]);
        }
      }
    }
  }
}

// y[i, n0 + c] for i < MR and c < cols (<= kPanelRows) from the panel.
template <int MR>
inline void PanelTile(const float* panel, int64_t nb, const float* xp, int64_t kp, float* y,
                      int64_t ldy, int64_t n0, int64_t cols) {
  alignas(32) float part[16][MR][kPanelRows];
  for (int lane = 0; lane < 16; ++lane) {
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const float* w = panel + lane * nb * 2 * kPanelRows;
    const float* x = xp + lane;
    for (int64_t b = 0; b < nb; ++b) {
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        const __m256 w0 = _mm256_load_ps(w + (b * 2 + q) * kPanelRows);
        const __m256 w1 = _mm256_load_ps(w + (b * 2 + q) * kPanelRows + 8);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m256 xv = _mm256_broadcast_ss(x + i * kp + b * 32 + 16 * q);
          acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      _mm256_store_ps(part[lane][i], acc[i][0]);
      _mm256_store_ps(part[lane][i] + 8, acc[i][1]);
    }
  }
  // The canonical lane sum, lanes j += j + w for w = 8, 4, 2, 1, eight outputs at a time.
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < 2; ++v) {
      __m256 p[16];
#pragma GCC unroll 16
      for (int lane = 0; lane < 16; ++lane) p[lane] = _mm256_load_ps(part[lane][i] + 8 * v);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) p[j] = _mm256_add_ps(p[j], p[j + 8]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) p[j] = _mm256_add_ps(p[j], p[j + 4]);
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) p[j] = _mm256_add_ps(p[j], p[j + 2]);
      p[0] = _mm256_add_ps(p[0], p[1]);
      float* out = y + i * ldy + n0 + 8 * v;
      if (cols >= 8 * v + 8) {
        _mm256_storeu_ps(out, p[0]);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, p[0]);
        for (int64_t c = 0; c < cols - 8 * v; ++c) out[c] = tmp[c];
      }
    }
  }
}

template <class L>
void PanelRange(const L& l, const Problem& p, int64_t n0, int64_t n1, int64_t full, int rem) {
  const int64_t nb = full + (rem ? 1 : 0);
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < 16 * nb * 2 * kPanelRows + 8) {
    buffer.resize(16 * nb * 2 * kPanelRows + 8);
  }
  // 32-byte aligned for the panel loads.
  float* panel = buffer.data() + (8 - (reinterpret_cast<uintptr_t>(buffer.data()) / 4) % 8) % 8;
  for (int64_t c0 = n0; c0 < n1; c0 += kPanelRows) {
    const int64_t cols = c0 + kPanelRows < n1 ? kPanelRows : n1 - c0;
    PackPanel(l, c0, cols, full, rem, panel);
    int64_t i = 0;
    for (; i + 6 <= p.m; i += 6) {
      PanelTile<6>(panel, nb, p.xp + i * p.kp, p.kp, p.y + i * p.ldy, p.ldy, c0, cols);
    }
    WithRemainder<6>(p.m - i, [&](auto mr) {
      PanelTile<decltype(mr)::value>(panel, nb, p.xp + i * p.kp, p.kp, p.y + i * p.ldy, p.ldy, c0,
                                     cols);
    });
  }
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
  if (p.m >= kPanelMinM) {
    PanelRange(l, p, n0, n1, full, rem);
    return;
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
      WithRemainder<4>(i1 - i,
                       [&](auto mr) { RowStrip<decltype(mr)::value>(l, p, i, c0, c1, full, rem); });
    }
  }
}

void Range(const Problem& p, int64_t n0, int64_t n1) {
  assert(!p.w->packed || p.w->layout != PackLayout::kTiles);  // matmul.cc routes kTiles elsewhere
  const Weight& w = *p.w;
  if (w.packed && w.layout == PackLayout::kLanes) {
    LaneMajorRangeAvx2(p, n0, n1);
    return;
  }
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
      if (w.packed && w.layout == PackLayout::kPairs) {
        RangeWith(Mxfp4PairsLoader{codes, w.scales, k}, p, n0, n1);
      } else if (w.packed) {
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
  // LaneTile<1, 8> and TwoRowTile<5> (matmul_avx2_lanes.cc), in groups of 8 rows.
  static const Kernels k{"avx2", &Range, nullptr, 8, 5};
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok ? &k : nullptr;
}

}  // namespace kimi::cpu::matmul_internal
