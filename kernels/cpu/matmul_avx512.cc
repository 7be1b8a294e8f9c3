// MatMul kernels for AVX-512 (F, BW, DQ, VL), chosen at run time. The summation order is the
// canonical one of matmul_impl.h. The target pragma below applies to the functions defined after
// it; a template defined before it (std:: and ours in headers), even when used after it, is
// compiled for the default target (GCC takes a template's target options from its definition), so
// no code the linker shares with other files needs AVX-512.
// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cache_line.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/side_prefetch.h"
#include <cpuid.h>
#include <immintrin.h>

namespace kimi::cpu::matmul_internal {
namespace {

// The E2M1 table times every E8M0 scale, so an MXFP4 block's decode loads its scaled table instead
// of multiplying the table by the scale: one vector op less per block, the same products (built
// before the target pragma: it runs at start-up on any x86-64).
struct ScaledE2m1 {
  alignas(64) float v[256][16];
  ScaledE2m1() {
    for (int s = 0; s < 256; ++s) {
      for (int c = 0; c < 16; ++c) v[s][c] = kE2m1[c] * kE8m0[s];
    }
  }
};
const ScaledE2m1 kScaledE2m1;

// The same products as bf16 for the bf16-activation path, each entry twice (entries c and c + 16)
// so that a 32-word vpermw may ignore index bit 4. E2M1 x 2^(s - 127) has at most two significant
// bits, so its fp32 value is exact in its top half (2^-128 at scale 0, NaN at 255 included): an
// MXFP4 weight on that path is its bf16 dequantization, bit for bit.
struct ScaledE2m1Bf16 {
  alignas(64) uint16_t v[256][32];
  ScaledE2m1Bf16() {
    for (int s = 0; s < 256; ++s) {
      for (int c = 0; c < 32; ++c) {
        uint32_t bits;
        std::memcpy(&bits, &kScaledE2m1.v[s][c % 16], 4);
        assert((bits & 0xffffu) == 0);
        v[s][c] = static_cast<uint16_t>(bits >> 16);
      }
    }
  }
};
const ScaledE2m1Bf16 kScaledE2m1Bf16;

}  // namespace

const uint16_t (*const kE2m1Bf16ByScale)[32] = kScaledE2m1Bf16.v;

namespace {

// Whether Bf16Group's prefetches ahead fill L2 (hint T1) instead of L1 (T0) when a group is read by
// more than one x row (Bf16Group::to_l2): on AMD family 19h, which in this file (AVX-512) means Zen
// 4, T1 brings a line into L2 without holding one of L1's few miss buffers for the whole trip to
// memory, so more of a group's next lines are in flight while the strips compute. Steps alternated
// every ten in one process on a 2-vCPU Zen 4 host (median of 8 per-pair ratios): the spread lines
// (SpreadOver), kimi-linear-small batch 8 / 32 / 64 0.92 / 0.94 / 0.97 of the time, k3-mini
// 0.99-1.00 (its batched products are compute-bound there); then the one-pass lines of strips of
// two or three x rows too (experts hit by two or three tokens: 1024 x 1024 at three rows took 1.78x
// the time of one row before, 1.03x after, each against one row in its own --matmul_profile run; an
// earlier try with T1 for every one-pass group, one row included, had measured 0.94 against the
// spread's 0.92), kimi-linear-small batch 8 0.97-1.00 (median 0.99 over 6 runs; the gain comes and
// goes with the host's memory phase), batch 32 0.99, with bf16 activations batch 8 0.98-1.02
// (median 0.99 over 4), batch 32 0.98. At one x row (a range's first 32 KiB) T1 was not faster:
// kimi-linear-small batch 1 1.03x, k3-mini 0.99-1.00; those keep T0. On the Zen 5 host (family 1Ah)
// the hint was slower for the spread (kimi-linear-small batch 8 / 32 1.07 / 1.04x), and no other
// machine has been measured: they keep T0. On Zen 4, T1 also for MXFP4 groups' prefetches,
// GroupsOneRow's or the prefill tiles' came out level (0.986-1.01), one-row ranges prefetched whole
// with T1, instead of left to the hardware prefetcher after their first 32 KiB, were 1.19-1.25x
// slower, and the spread twice as far ahead with T1 was level with once.
bool PrefetchAheadToL2() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  if (!amd || __get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  const unsigned base = (a >> 8) & 0xfu;
  const unsigned family = base == 0xfu ? base + ((a >> 20) & 0xffu) : base;
  return family == 0x19u;
}
const bool kPrefetchAheadToL2 = PrefetchAheadToL2();

// Per-thread scratch of at least `floats` floats (the bf16 path's decoded MXFP4 groups and
// partial-group sums, the fp32 path's kept sums in RangeWithSlices): one buffer a thread for all of
// them, so a caller must not hold the pointer across another call (a resize moves it). It starts
// on a cache line. Its std::vector is compiled for the default target wherever it is used (the
// file's head says why).
float* ThreadScratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  return CacheLineAligned(buffer, floats);
}

}  // namespace
}  // namespace kimi::cpu::matmul_internal

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2")

namespace kimi::cpu::matmul_internal {
namespace {

#define KIMI_ALWAYS_INLINE inline __attribute__((always_inline))

// 32 bf16 weights (one block) as fp32: the even elements, then the odd ones.
KIMI_ALWAYS_INLINE void SplitBf16(__m512i v, __m512& e, __m512& o) {
  e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  o = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// One MXFP4 block (16 code bytes, scale byte s) as fp32: E2M1(code) * 2^(s - 127), exact.
KIMI_ALWAYS_INLINE void DecodeMxfp4(const uint8_t* codes, uint8_t s, __m512& e, __m512& o) {
  const __m512 scaled = _mm512_load_ps(kScaledE2m1.v[s]);
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  // vpermps reads only the low 4 bits of each index: the low nibble needs no mask.
  e = _mm512_permutexvar_ps(c, scaled);
  o = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), scaled);
}

// One MXFP4 block as 32 bf16 weights in element order (word i = element i), for vdpbf16ps. Dword j
// of the widened codes is byte j; or-ing in byte j << 12 leaves word 2j's low five bits (all vpermw
// reads) as the low nibble plus a bit the doubled table ignores, and makes word 2j + 1 the high
// nibble.
KIMI_ALWAYS_INLINE __m512i DecodeMxfp4Bf16(const uint8_t* codes, uint8_t s) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm512_permutexvar_epi16(_mm512_or_si512(c, _mm512_slli_epi32(c, 12)),
                                  _mm512_load_si512(kScaledE2m1Bf16.v[s]));
}

// Loaders: block b of row r as two fp32 vectors, the even and the odd elements of the block.
// LoadTail reads only the first `rem` (< 32) elements and zero-fills the rest.
struct Bf16Loader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    SplitBf16(_mm512_loadu_si512(base + r * k + b * 32), e, o);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t r, int64_t b) const { _mm_prefetch(reinterpret_cast<const char*>(base + r * k + b * 32), _MM_HINT_T0); }
  int64_t RowBytes() const { return k * 2; }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t r, int64_t b, int rem, __m512& e, __m512& o) const {
    SplitBf16(_mm512_maskz_loadu_epi16(_bzhi_u32(~0u, rem), base + r * k + b * 32), e, o);
  }
};

struct F16Loader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE static void Split(__m512i v, __m512& e, __m512& o) {
    e = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    o = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    Split(_mm512_loadu_si512(base + r * k + b * 32), e, o);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t r, int64_t b) const { _mm_prefetch(reinterpret_cast<const char*>(base + r * k + b * 32), _MM_HINT_T0); }
  int64_t RowBytes() const { return k * 2; }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t r, int64_t b, int rem, __m512& e, __m512& o) const {
    Split(_mm512_maskz_loadu_epi16(_bzhi_u32(~0u, rem), base + r * k + b * 32), e, o);
  }
};

struct F32Loader {
  const float* base;
  int64_t k;
  KIMI_ALWAYS_INLINE static void Split(__m512 lo, __m512 hi, __m512& e, __m512& o) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    e = _mm512_permutex2var_ps(lo, ie, hi);
    o = _mm512_permutex2var_ps(lo, io, hi);
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    const float* p = base + r * k + b * 32;
    Split(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16), e, o);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t r, int64_t b) const {
    _mm_prefetch(reinterpret_cast<const char*>(base + r * k + b * 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(base + r * k + b * 32 + 16), _MM_HINT_T0);
  }
  int64_t RowBytes() const { return k * 4; }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t r, int64_t b, int rem, __m512& e, __m512& o) const {
    const float* p = base + r * k + b * 32;
    const __mmask16 m0 = static_cast<__mmask16>(_bzhi_u32(0xffffu, rem));
    const __mmask16 m1 = static_cast<__mmask16>(_bzhi_u32(0xffffu, rem > 16 ? rem - 16 : 0));
    Split(_mm512_maskz_loadu_ps(m0, p), _mm512_maskz_loadu_ps(m1, p + 16), e, o);
  }
};

struct Mxfp4Loader {
  const uint8_t* packed;  // [rows, k/2]
  const uint8_t* scales;  // [rows, k/32]
  int64_t k;
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    DecodeMxfp4(packed + r * (k / 2) + b * 16, scales[r * (k / 32) + b], e, o);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t r, int64_t b) const {
    _mm_prefetch(reinterpret_cast<const char*>(packed + r * (k / 2) + b * 16), _MM_HINT_T0);
    if (b % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(scales + r * (k / 32) + b), _MM_HINT_T0);
  }
  int64_t RowBytes() const { return k / 2 + k / 32; }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, __m512& e, __m512& o) const {  // k % 32 == 0
    e = _mm512_setzero_ps();
    o = _mm512_setzero_ps();
  }
};

// Packed layouts (kernels/cpu/pack.h): a group of kPackRows rows is one linear stream.
struct Bf16PackedLoader {
  const uint16_t* base;
  int64_t k;
  KIMI_ALWAYS_INLINE const uint16_t* At(int64_t r, int64_t b) const {
    return base + (r / kPackRows) * kPackRows * k + b * 32 * kPackRows + (r % kPackRows) * 32;
  }
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    SplitBf16(_mm512_loadu_si512(At(r, b)), e, o);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t r, int64_t b) const {
    _mm_prefetch(reinterpret_cast<const char*>(At(r, b)), _MM_HINT_T0);
  }
  int64_t RowBytes() const { return k * 2; }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, __m512& e, __m512& o) const {  // k % 32 == 0
    e = _mm512_setzero_ps();
    o = _mm512_setzero_ps();
  }
};

struct Mxfp4PackedLoader {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t k;
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    const int64_t g = r / kPackRows, j = r % kPackRows;
    DecodeMxfp4(packed + g * kPackRows * (k / 2) + b * 16 * kPackRows + j * 16,
                scales[g * kPackRows * (k / 32) + b * kPackRows + j], e, o);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t r, int64_t b) const {
    const int64_t g = r / kPackRows, j = r % kPackRows;
    _mm_prefetch(reinterpret_cast<const char*>(packed + g * kPackRows * (k / 2) + b * 16 * kPackRows + j * 16),
                 _MM_HINT_T0);
    if (b % 8 == 0 && j == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(scales + g * kPackRows * (k / 32) + b * kPackRows),
                   _MM_HINT_T0);
    }
  }
  int64_t RowBytes() const { return k / 2 + k / 32; }
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, __m512& e, __m512& o) const {
    e = _mm512_setzero_ps();
    o = _mm512_setzero_ps();
  }
};

// The canonical pairwise lane sum: lanes j += j + 8, then + 4, + 2, + 1.
KIMI_ALWAYS_INLINE float Reduce(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

// Reduce for 16 accumulators at once, by transposing as it adds: out[4k + t] = Reduce(v[4t + k]),
// with every addition of Reduce in the same place (lane pairs j, j + 8, then j, j + 4, then j,
// j + 2, then j, j + 1), so the sums are the same bits. 30 shuffles and 15 adds where 16 Reduce
// calls take 64 and 64: at K = 512 a 4 x 4 tile's 16 blocks of 32 FMAs spent about a fifth of its
// time in the reductions. One thread, in cache, GFLOP/s: 2048 x 512 at m = 2 / 8 / 64 / 512:
// 161-163 / 178-181 / 147-168 / 170-171 before, 176-177 / 198-201 / 185-193 / 187 after. The tree
// is lanes.h's SumLanes16, shared with MLA's score tiles (the compiler keeps r in registers).
KIMI_ALWAYS_INLINE __m512 Reduce16(const __m512 (&v)[16]) {
  LaneVec<16>::V w[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) w[t] = reinterpret_cast<LaneVec<16>::V>(v[t]);
  float r[16];
  SumLanes16(w, r);
  return _mm512_loadu_ps(r);
}

// y[i * ldy + j] = Reduce(acc[i][j]) for MR <= 4 x rows of 4 sums, through Reduce16. acc points
// at the first of the MR rows (a tile's accumulators, or rows further down them).
template <int MR>
KIMI_ALWAYS_INLINE void StoreQuadSums(const __m512 (*acc)[4], float* y, int64_t ldy) {
  __m512 v[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) v[t] = t % 4 < MR ? acc[t % 4][t / 4] : acc[0][0];  // v[4t + k]
  const __m512 r = Reduce16(v);  // r[4k + t] = acc[k][t]
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m128 row = i == 0   ? _mm512_castps512_ps128(r)
                       : i == 1 ? _mm512_extractf32x4_ps(r, 1)
                       : i == 2 ? _mm512_extractf32x4_ps(r, 2)
                                : _mm512_extractf32x4_ps(r, 3);
    _mm_storeu_ps(y + i * ldy, row);
  }
}

// The same for one or two x rows of 8 sums (a whole group).
template <int MR>
KIMI_ALWAYS_INLINE void StoreGroupSums(const __m512 (*acc)[kPackRows], float* y, int64_t ldy) {
  static_assert(MR == 1 || MR == 2);
  __m512 v[16];  // v[4 (j % 4) + 2 i + j / 4] = acc[i][j]; for one row, lanes 8-15 are unused
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) {
    const int i = t / 8, j = t % 8;
    v[4 * (j % 4) + 2 * i + j / 4] = i < MR ? acc[i][j] : acc[0][0];
  }
  const __m512 r = Reduce16(v);  // r[8i + j] = acc[i][j]
  _mm256_storeu_ps(y, _mm512_castps512_ps256(r));
  if constexpr (MR == 2) _mm256_storeu_ps(y + ldy, _mm512_extractf32x8_ps(r, 1));
}

// A slice of K (blocks [b0, end)) of products whose lane accumulators wait in memory between
// slices (RangeWithSlices): accumulator (i, j) of a tile at at[i * stride + j]; the first slice
// (b0 = 0) starts from zero, the last one reduces into y. The default is the whole of K.
struct KeptSums {
  __m512* at = nullptr;
  int64_t stride = 0;
  int64_t b0 = 0;
  bool last = true;
  KIMI_ALWAYS_INLINE KeptSums Offset(int64_t rows, int64_t cols) const {
    KeptSums k = *this;
    if (at) k.at += rows * stride + cols;
    return k;
  }
};

// y[i, n + j] for i < MR, j < NR: MR rows of xp against NR rows of W, the whole of K (blocks up to
// `full`, then a tail of `rem` columns), or one slice of it (`kept`).
// With `ahead` > 0, block b of rows n + ahead .. n + ahead + NR - 1 is prefetched while block b of
// this tile is read: the weights of a later tile arrive while this one computes. Rows of a few KiB
// are too short for the hardware prefetcher to lock on by itself.
template <int MR, int NR, class L>
inline void Tile(const L& l, const float* xp, int64_t kp, float* y, int64_t ldy, int64_t n,
                 int64_t full, int rem, int64_t ahead = 0, const KeptSums& kept = {}) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      acc[i][j] =
          kept.b0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(kept.at + i * kept.stride + j);
    }
  }
  // x first (2 MR registers), then one W row at a time, used by every x row at once: MR * NR
  // accumulators + 2 MR + 2 registers.
  const auto step = [&](int64_t b, bool tail) {
    __m512 xe[MR], xo[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      xe[i] = _mm512_loadu_ps(xp + i * kp + b * 32);
      xo[i] = _mm512_loadu_ps(xp + i * kp + b * 32 + 16);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      __m512 we, wo;
      if (tail) {
        l.LoadTail(n + j, b, rem, we, wo);
      } else {
        l.Load(n + j, b, we, wo);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm512_fmadd_ps(xe[i], we, acc[i][j]);
        acc[i][j] = _mm512_fmadd_ps(xo[i], wo, acc[i][j]);
      }
    }
  };
  for (int64_t b = kept.b0; b < full; ++b) {
    if (ahead > 0) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) l.Prefetch(n + ahead + j, b);
    }
    step(b, false);
  }
  if (rem) step(full, true);
  if (!kept.last) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm512_store_ps(kept.at + i * kept.stride + j, acc[i][j]);
    }
    return;
  }
  if constexpr (MR == 4 && NR == 4) {
    StoreQuadSums<4>(acc, y + n, ldy);
    return;
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = Reduce(acc[i][j]);
  }
}

// One packed (kBlocks) group of weights, block after block, read through one pointer at constant
// offsets: row j of block b as its even and odd fp32 vectors, decoded as Bf16PackedLoader and
// Mxfp4PackedLoader do (the same values), and a software prefetch kOneRowAhead bytes of weights
// ahead. Tile<MR, NR> with those loaders computes the same sums, but addresses each row through
// the loader: on Zen 5 GCC kept the row offsets (and, for bf16, a spilled weight vector) on the
// stack or in vector registers, and at one x row the loop read 0.5-0.65 of one thread's
// streaming-read bandwidth where this one reads 0.85-0.95. The prefetch matters for the short
// ranges of a decode step (a 512-wide matrix is a few hundred KiB): without it a batch-1 step on
// kimi-linear-small took 12.3-13.0 ms, with 2-8 KiB ahead 10.4-11.7 ms, with 16 KiB 10.7-11.5 ms.
constexpr int64_t kOneRowAhead = 8192;

// One line of each 4 KiB page kPageAheadBytes ahead of a group's stream of weights, whatever its
// line prefetches do: the address translation of the pages ahead is then in the TLB before the
// line prefetches and the loads reach them. On the Zen 5 host (a virtual machine: a 2 MiB guest
// page is no help when the host maps it in 4 KiB pages) a product streaming cold weights otherwise
// stalled on a page walk every 4 KiB, which the 8 KiB-ahead line prefetches did not hide. Expert
// jobs as the engine runs them (1024 x 1024 and 1024 x 512 bf16 at two x rows, one thread, 768
// MB of experts): 21-23 -> 43-44 GB/s (at 32 / 128 KiB ahead 39 / 42). Steps alternated every ten
// in one process (median of 6-8 per-pair ratios): kimi-linear-small batch 1 0.79-0.92, batch 8
// 0.83-0.98, batch 32 0.92, batch 64 0.93; k3-mini batch 1 0.85-0.91, batch 8 / 32 / 64 0.99 /
// 1.01 / 0.98 (its MXFP4 experts are decode-bound there).
template <int64_t kBlockBytes>
KIMI_ALWAYS_INLINE void PrefetchPageAhead(const void* block0, int64_t b) {
  constexpr int64_t kBlocksPerPage = 4096 / kBlockBytes;
  if (b % kBlocksPerPage == 0) {
    _mm_prefetch(static_cast<const char*>(block0) + b * kBlockBytes + kPageAheadBytes, _MM_HINT_T0);
  }
}

// How a group's prefetches are spread when it is read in several passes, one per strip of x rows
// (Bf16Group::SpreadOver, SpreadLine).
struct PassSpread {
  int pass = 0, passes = 1;  // this pass (from 0) of passes
  int64_t nb = 0;            // blocks in a pass
  int64_t ahead = 0;         // bytes from this group's start to the lines spread over its passes
};

struct Bf16Group {
  static constexpr int kStripRows = 3;     // x rows per strip: widening a block is two instructions
  static constexpr int kGroupsAtOnce = 3;  // GroupsOneRow at one x row (24 accumulators)
  static constexpr int64_t kBlockBytes = kPackRows * 64;
  static constexpr int64_t kAheadBytes = kOneRowAhead;  // Prefetch's distance
  static constexpr bool kSpreadsPrefetch = true;        // see SpreadOver
  const uint16_t* g;                                    // the group's block 0
  // Lines of the side prefetch (side_prefetch.h) a block visit, when there is one: the window it
  // serves (a KDA layer's projections at batch 32: 48K block visits for 8.8 MB of states, 138K
  // lines) has only bf16 groups. 4 and 3 lines took all of it (batch-32 k3-mini steps 0.980 /
  // 0.981 and 0.976 / 0.981 of the time), 2 lines did not (0.987 / 0.987).
  static constexpr int kSideLines = 4;
  bool prefetch = true;  // software prefetches on (GroupStrips turns them off, see there)
  bool to_l2 = false;    // prefetches fill L2, not L1 (ToL2, kPrefetchAheadToL2)
  PassSpread spread{};
  static int64_t RowBytes(int64_t nb) { return nb * 64; }
  // For a read by m x rows: to L2 where kPrefetchAheadToL2 holds and m > 1 (see there).
  void ToL2(int64_t m) { to_l2 = kPrefetchAheadToL2 && m > 1; }
  // Read in `passes` passes of nb blocks (GroupStrips' strips of x rows: the first pass takes the
  // group from memory, the later ones find it in L1). With each pass prefetching kAheadBytes past
  // the block it reads, only the first asked for new lines and the memory idled while the later
  // ones computed. Spread, the lines one group on (whole groups, at least kAheadBytes) are shared
  // out evenly over every block visit of every pass (SpreadLine), so the memory streams the next
  // group all the while. On the Zen 5 host: 1024 x 1024 (kimi-linear-small's experts) at m = 4-8
  // on two threads, cold, a probe alternating the two: 0.85-0.95 of the time (a group ahead; a
  // group and 2 or 8 KiB, or fewer bytes than the group, were slower). Steps alternated every ten
  // in one process (median of 6-8 per-pair ratios, three runs): kimi-linear-small batch 8 / 32 / 64
  // 0.94-0.95 / 0.95-0.99 / 0.96-0.97, k3-mini 0.96-0.97 / 0.99 / 0.98-1.01. On Zen 4 the spread
  // lines go to L2 (kPrefetchAheadToL2); there, not spreading cost kimi-linear-small batch
  // 8 1.03x, k3-mini 1.05x (with T0 lines, before that change). On Zen 5 only the fp32 path
  // spreads: on the bf16 one (GroupRowsBf16) a pass of dot products is as short as its memory
  // time, and spread there a batch-8 k3-mini step took 1.02-1.05x (its LM head at 8 rows read
  // 42-47 GB/s, not 54-61), kimi-linear-small batch 32 0.97-0.99x; on Zen 4, with the lines in
  // L2, the bf16 path spreads too (GroupStripsBf16).
  void SpreadOver(int passes, int64_t nb) {
    spread = PassSpread{0, passes, nb, SpreadAheadBytes(nb * kBlockBytes, kAheadBytes)};
  }
  KIMI_ALWAYS_INLINE void PrefetchPage(int64_t b) const { PrefetchPageAhead<kBlockBytes>(g, b); }
  KIMI_ALWAYS_INLINE void PrefetchBlock(int64_t b) const {
    if (!prefetch) return;
#pragma GCC unroll 8
    for (int j = 0; j < kPackRows; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(g + (b * kPackRows + j) * 32), _MM_HINT_T0);
    }
  }
  // The lines kAheadBytes past block b (one pass), or block visit b's share of the spread lines.
  KIMI_ALWAYS_INLINE void Prefetch(int64_t b) const {
    if (!prefetch) return;
    const char* base = reinterpret_cast<const char*>(g);
    if (spread.passes == 1) {
#pragma GCC unroll 8
      for (int j = 0; j < kPackRows; ++j) {
        PrefetchAhead(base + (b * kPackRows + j) * 64 + kAheadBytes);
      }
      return;
    }
    const int64_t visit = spread.pass * spread.nb + b;
    const int64_t end = SpreadLine(visit + 1, kPackRows, spread.passes);
    for (int64_t l = SpreadLine(visit, kPackRows, spread.passes); l < end; ++l) {
      PrefetchAhead(base + spread.ahead + l * 64);
    }
  }
  // One line of the stream ahead, into L2 or L1 (to_l2).
  KIMI_ALWAYS_INLINE void PrefetchAhead(const char* line) const {
    if (to_l2) {
      _mm_prefetch(line, _MM_HINT_T1);
    } else {
      _mm_prefetch(line, _MM_HINT_T0);
    }
  }
  KIMI_ALWAYS_INLINE void Load(int64_t b, int j, __m512& e, __m512& o) const {
    SplitBf16(LoadBf16(b, j), e, o);
  }
  KIMI_ALWAYS_INLINE __m512i LoadBf16(int64_t b, int j) const {
    return _mm512_loadu_si512(g + (b * kPackRows + j) * 32);
  }
};
struct Mxfp4Group {
  static constexpr int kStripRows = 4;  // x rows per strip: each code decoded once for four rows
  const uint8_t* codes;                 // the group's block 0
  const uint8_t* scales;  // the group's block 0
  // One group at a time: GroupsOneRow was slower with the decode (one cold thread, K = 1024-7168,
  // paired passes: three groups 0.5-0.7x, two 0.72-0.86x).
  static constexpr int kGroupsAtOnce = 1;
  // Not spread as Bf16Group's prefetches: with the MXFP4 strips spread too, batch-8 / 32 / 64
  // k3-mini steps took 0.99 / 1.00 / 1.02 of the time, against 0.96-0.97 / 0.99 / 0.98-1.01 with
  // bf16 groups alone (the same alternation): a strip's decode leaves less memory time to hide.
  static constexpr bool kSpreadsPrefetch = false;
  static constexpr int kSideLines = 0;  // see Bf16Group's
  bool prefetch = true;
  KIMI_ALWAYS_INLINE void PrefetchPage(int64_t b) const {  // the codes (the scales are 1/16)
    PrefetchPageAhead<16 * kPackRows>(codes, b);
  }
  static int64_t RowBytes(int64_t nb) { return nb * 17; }  // 16 code bytes and a scale per block
  KIMI_ALWAYS_INLINE void Prefetch(int64_t b) const {
    if (!prefetch) return;
    const char* c = reinterpret_cast<const char*>(codes + b * 16 * kPackRows) + kOneRowAhead / 2;
    _mm_prefetch(c, _MM_HINT_T0);
    _mm_prefetch(c + 64, _MM_HINT_T0);
  }
  KIMI_ALWAYS_INLINE void Load(int64_t b, int j, __m512& e, __m512& o) const {
    DecodeMxfp4(codes + (b * kPackRows + j) * 16, scales[b * kPackRows + j], e, o);
  }
  KIMI_ALWAYS_INLINE __m512i LoadBf16(int64_t b, int j) const {
    return DecodeMxfp4Bf16(codes + (b * kPackRows + j) * 16, scales[b * kPackRows + j]);
  }
};

// acc[i][j] += x row i against group row j0 + j over blocks [b0, b1), i < MR, j < NR: each weight
// decoded once for all MR rows.
// Each block prefetches G::kAheadBytes ahead in g, or with kLater block b + shift of `later`, and
// each page of g's stream the page kPageAheadBytes on (PrefetchPageAhead); with kSide, also
// G::kSideLines lines of `side` (a piece of the side prefetch) while they last.
template <int MR, int NR, bool kLater = false, class G, bool kSide = false>
KIMI_ALWAYS_INLINE void GroupBlocks(const G& g, const float* xp, int64_t kp, int64_t b0, int64_t b1,
                                    int j0, __m512 (&acc)[MR][NR], const G* later = nullptr,
                                    int64_t shift = 0, SidePiece* side = nullptr) {
  for (int64_t b = b0; b < b1; ++b) {
    if constexpr (kSide) {
#pragma GCC unroll 4
      for (int t = 0; t < G::kSideLines; ++t) {
        if (side->p < side->end) {
          _mm_prefetch(side->p, _MM_HINT_T1);
          side->p += 64;
        }
      }
    }
    __m512 xe[MR], xo[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      xe[i] = _mm512_loadu_ps(xp + i * kp + b * 32);
      xo[i] = _mm512_loadu_ps(xp + i * kp + b * 32 + 16);
    }
    if constexpr (kLater) {
      later->PrefetchBlock(b + shift);
    } else {
      g.Prefetch(b);
    }
    g.PrefetchPage(b);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      __m512 we, wo;
      g.Load(b, j0 + j, we, wo);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm512_fmadd_ps(xe[i], we, acc[i][j]);
        acc[i][j] = _mm512_fmadd_ps(xo[i], wo, acc[i][j]);
      }
    }
  }
}

// The same over the whole of K, from zero.
template <int MR, int NR, class G, bool kSide = false>
KIMI_ALWAYS_INLINE void GroupSums(const G& g, const float* xp, int64_t kp, int64_t nb, int j0,
                                  __m512 (&acc)[MR][NR], SidePiece* side = nullptr) {
#pragma GCC unroll 16
  for (int t = 0; t < MR * NR; ++t) (&acc[0][0])[t] = _mm512_setzero_ps();
  GroupBlocks<MR, NR, false, G, kSide>(g, xp, kp, 0, nb, j0, acc, nullptr, 0, side);
}

// One x row against G::kGroupsAtOnce groups together: K in chunks of kChunkBlocks blocks, each
// chunk taken group after group, so that a chunk of x serves all the groups while it is in L1. Each
// sum still runs over the blocks in order (GroupSums' order): the results are the same bits. Group
// after group, one cold thread on Zen 5 read bf16 weights at 0.69-0.74 of the streaming read at
// K = 2048-7168, three groups in chunks at 0.80-0.87 (paired passes through MatMul: 1.08-1.19x on 1
// thread, 1.10-1.16x on 2). x's reuse is what changes: in a standalone copy of the loop, one group
// at a time against a 1 KiB x that it cycled through ran as fast as the chunks.
constexpr int64_t kChunkBlocks = 4;
template <class G>
KIMI_ALWAYS_INLINE void GroupsOneRow(const G* g, const float* xp, int64_t nb, float* y) {
  constexpr int NG = G::kGroupsAtOnce;
  __m512 acc[NG][1][kPackRows];
#pragma GCC unroll 24
  for (int t = 0; t < NG * kPackRows; ++t) (&acc[0][0][0])[t] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
    const int64_t b1 = b0 + kChunkBlocks < nb ? b0 + kChunkBlocks : nb;
    // The prefetch runs G::kAheadBytes ahead in the order the weights are read: `ahead`
    // group-chunks on, whichever group that is.
    constexpr int64_t ahead = G::kAheadBytes / (kChunkBlocks * G::kBlockBytes);
#pragma GCC unroll 3
    for (int t = 0; t < NG; ++t) {
      GroupBlocks<1, kPackRows, true>(g[t], xp, 0, b0, b1, 0, acc[t], &g[(t + ahead) % NG],
                                      (t + ahead) / NG * kChunkBlocks);
    }
  }
#pragma GCC unroll 3
  for (int t = 0; t < NG; ++t) StoreGroupSums<1>(acc[t], y + t * kPackRows, 0);
}

// Packed bf16 or MXFP4 (kBlocks) W rows [n0, n1) against m x rows (StripsFit): group after
// group (bf16 at one x row and K >= 2048: three groups together, GroupsOneRow), one to three x rows
// against the whole group, or (MXFP4, m >= 3) strips of four x rows
// against half a group, so that a code is decoded once per four rows. bf16 weights take strips of
// three rows (24 accumulators, x's six vectors, one weight vector's two halves: all 32 registers),
// then two or one: widening costs two instructions per weight vector, once per strip. Strips of two
// against Tile<4, 4>, one thread, in-cache and streamed shapes at m = 4-16 (K =
// 512-4096): 1.07-1.26x (a one-pointer 4 x 4 form was no faster); three against two, alternated in
// one process, 1024 x 1024 at m = 3-16 1.04-1.18x on one thread, 2048 x 512 / 512 x 4096 / the LM
// head at m = 8 and 32 1.07-1.19x on two; steps, k3-mini batch 8 / 32 / 64 0.96 / 0.98 / 0.95,
// kimi-linear-small batch 8 / 32 0.94 / 0.95. MXFP4 strips of four: batch-8 / 32 / 64 k3-mini
// steps, four alternations with Tile, 17.2-17.9 / 50.5-57.9 / 98-107 ms against 18.6-22.3
// / 54.7-59.7 / 102-119 ms. Two rows (experts hit by two tokens) against Tile<2, 8>: batch-8
// k3-mini 18.1-18.3 against 18.6-18.9 ms.
constexpr int64_t kMaxStripRows = 16;  // above it, Tile<4, 4> with x blocked for L2
// Strips also serve up to kMaxWideStripRows rows while x (which every strip reads again for each
// group) has at most kMaxWideStripX elements: 512 KiB in fp32, 256 KiB in bf16, in L2. One thread,
// the two ways alternating in one process, fp32 path: bf16 2048 x 512 / 2048 x 1024 / 1024 x 4096
// at 32 rows 1.12 / 1.06 / 1.06x, at 64 rows 1.11 / 1.12 / 0.93x (x 1 MiB); MXFP4 512 x 256 and
// 256 x 256 (K3's experts) at 20-64 rows 1.19-1.24x, 1024 x 1024 1.02-1.05x; the LM head's shape
// 1.01-1.05x. bf16 path (GroupStripsBf16 against TileBf16's strips): 2048 x 512 / 2048 x 1024 at 32
// and 64 rows 1.16-1.37x on 1 and 2 threads, 1024 x 4096 at 32 rows 1.03x, at 64 0.90x. Steps
// alternated every ten in one process (median of 3-6 per-pair ratios), fp32 path: k3-mini batch 32
// 0.96 / 0.95, batch 64 0.99 / 0.94 / 0.97; kimi-linear-small batch 32 0.93, batch 64 0.97; bf16
// path: k3-mini batch 32 / 64 0.87 / 0.88, kimi-linear-small 0.88 / 0.93.
constexpr int64_t kMaxWideStripRows = 64;
constexpr int64_t kMaxWideStripX = 128 << 10;
bool StripsFit(const Problem& p) {
  return p.m <= kMaxStripRows || (p.m <= kMaxWideStripRows && p.m * p.kp <= kMaxWideStripX);
}
// GroupsOneRow from K = 2048 (64 blocks) on: at K = 1024 it was 0.95-1.13x one group at a time
// (paired passes, 1 and 2 threads), at 2304-7168 1.08-1.19x.
constexpr int64_t kGroupsOneRowMinBlocks = 64;
// At one x row a range is one forward stream of weights: the software prefetches start it (a
// stream's first lines arrive before the hardware prefetcher has locked on) and stop after its
// first kOneRowPrefetchBytes, where the hardware prefetcher alone reads faster than with a
// prefetch for every line besides it. Decode steps alternated every ten steps in one process
// (median of per-pair ratios, 15-20 pairs), against prefetching every line: kimi-linear-small
// batch 1 0.92-0.96 on 2 threads, 0.87-1.04 (median 0.95) on 1; k3-mini 0.95-0.98, 0.90-1.03
// (median 0.93) on 1; spans of 8 to 128 KiB all gained, 1 MiB did not. MXFP4 ranges (an expert's
// 35-70 KB at batch 1) take the same rule, level. GroupsOneRow keeps every prefetch: it reads three
// groups in 4 KiB chunks, which the hardware does not follow (2048 x 7168 at 0.75-0.8 of the
// speed without them). With more x rows a group is read once per strip, not as one stream, and
// stopping the prefetches cost a batch-8 k3-mini step 16%: they stay on there too.
// The bf16-activation path's one-group loops follow the same rule: the LM head's product alone
// (100512 x 1024, one thread, alternated in a probe) read 0.86-0.90 of an xor read of its bytes
// with it, 0.72-0.80 with every prefetch.
constexpr int64_t kOneRowPrefetchBytes = 32 << 10;
// Whether group row n of a range that starts at n0 is prefetched in software.
template <class G>
bool PrefetchGroup(const Problem& p, int64_t n0, int64_t n) {
  return p.m > 1 || (n - n0) * G::RowBytes(p.w->cols / 32) < kOneRowPrefetchBytes;
}
// The strips GroupStrips reads a group in for m x rows, in order: f(i, rows, j0, cols) for x rows
// [i, i + rows) against group rows [j0, j0 + cols), rows and cols as integral constants. bf16
// takes strips of three x rows against the whole group (four rows left go as two strips of two,
// not 3 + 1), MXFP4 at m >= 3 strips of four (or three) against each half of the group, then
// either takes the last one or two rows against the whole group.
template <class G, class F>
KIMI_ALWAYS_INLINE void ForEachStrip(int64_t m, const F& f) {
  using Four = std::integral_constant<int, 4>;
  using Three = std::integral_constant<int, 3>;
  using Whole = std::integral_constant<int, kPackRows>;
  int64_t i = 0;
  if constexpr (G::kStripRows == 4) {
    if (m >= 3) {
      for (int j0 = 0; j0 < kPackRows; j0 += 4) {
        for (i = 0; i + 4 <= m; i += 4) f(i, Four{}, j0, Four{});
        if (m - i == 3) {
          f(i, Three{}, j0, Four{});
          i += 3;
        }
      }
    }
  }
  if constexpr (G::kStripRows == 3) {
    for (; i + 3 <= m && m - i != 4; i += 3) f(i, Three{}, 0, Whole{});
  }
  for (; i + 2 <= m; i += 2) f(i, std::integral_constant<int, 2>{}, 0, Whole{});
  if (i < m) f(i, std::integral_constant<int, 1>{}, 0, Whole{});
}

// y[i * ldy + j] for MR x rows of NR sums (a strip's accumulators), through Reduce16.
template <int MR, int NR>
KIMI_ALWAYS_INLINE void StoreStripSums(const __m512 (&acc)[MR][NR], float* y, int64_t ldy) {
  if constexpr (NR == 4) {
    StoreQuadSums<MR>(acc, y, ldy);
  } else if constexpr (MR == 3) {
    StoreGroupSums<2>(acc, y, ldy);
    StoreGroupSums<1>(acc + 2, y + 2 * ldy, ldy);
  } else {
    StoreGroupSums<MR>(acc, y, ldy);
  }
}

template <class G, class MakeGroup>
inline void GroupStrips(const MakeGroup& make, const Problem& p, int64_t n0, int64_t n1) {
  const int64_t nb = p.w->cols / 32;
  int64_t n = n0;
  constexpr int NG = G::kGroupsAtOnce;
  if constexpr (NG > 1) {
    if (p.m == 1 && nb >= kGroupsOneRowMinBlocks) {
      for (; n + NG * kPackRows <= n1; n += NG * kPackRows) {
        G g[NG];
        for (int t = 0; t < NG; ++t) g[t] = make(n + t * kPackRows);
        GroupsOneRow(g, p.xp, nb, p.y + n);
      }
    }
  }
  int passes = 0;
  ForEachStrip<G>(p.m, [&](int64_t, auto, int, auto) { ++passes; });
  // The side prefetch, if any, a piece at a time (each group takes a new one when the last is
  // done), in its own build of the strips so that the loops without it stay as they were.
  bool side_on = G::kSideLines > 0 && SidePrefetchActive();
  SidePiece side;
  for (; n < n1; n += kPackRows) {
    G g = make(n);
    g.prefetch = PrefetchGroup<G>(p, n0, n);
    if (side_on && side.p >= side.end) {
      side = ClaimSidePiece();
      side_on = side.p < side.end;
    }
    if constexpr (G::kSpreadsPrefetch) {
      g.ToL2(p.m);
      if (passes > 1) g.SpreadOver(passes, nb);
    }
    // Inlined, as the loops it stands for were (GCC otherwise kept the one-row MXFP4 strip, batch
    // 1's expert products, in a function of its own).
    ForEachStrip<G>(
        p.m, [&](int64_t i, auto rows, int j0, auto cols) __attribute__((always_inline)) {
          constexpr int MR = decltype(rows)::value, NR = decltype(cols)::value;
          __m512 acc[MR][NR];
          if (side_on) {  // never for groups without side lines: one build of their strips
            GroupSums<MR, NR, G, (G::kSideLines > 0)>(g, p.xp + i * p.kp, p.kp, nb, j0, acc, &side);
          } else {
            GroupSums<MR, NR, G>(g, p.xp + i * p.kp, p.kp, nb, j0, acc);
          }
          StoreStripSums<MR, NR>(acc, p.y + i * p.ldy + n + j0, p.ldy);
          if constexpr (G::kSpreadsPrefetch) ++g.spread.pass;
        });
  }
}

// Rows [i0, i0 + MR) of the problem against W rows [n0, n1): tiles of 4 W rows, then single rows.
template <int MR, class L>
inline void RowStrip(const L& l, const Problem& p, int64_t i0, int64_t n0, int64_t n1, int64_t full,
                     int rem, int64_t ahead, const KeptSums& kept) {
  const float* xp = p.xp + i0 * p.kp;
  float* y = p.y + i0 * p.ldy;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    Tile<MR, 4>(l, xp, p.kp, y, p.ldy, n, full, rem, ahead, kept.Offset(0, n - n0));
  }
  for (; n < n1; ++n) Tile<MR, 1>(l, xp, p.kp, y, p.ldy, n, full, rem, 0, kept.Offset(0, n - n0));
}

// x rows [i0, i1) against W rows [c0, c1): strips of four x rows, then the rest as one strip. The
// first strip pulls the W chunk from memory: it prefetches `ahead` rows ahead.
template <class L>
inline void RowStrips(const L& l, const Problem& p, int64_t i0, int64_t i1, int64_t c0, int64_t c1,
                      int64_t full, int rem, int64_t ahead, const KeptSums& kept = {}) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    RowStrip<4>(l, p, i, c0, c1, full, rem, i == i0 ? ahead : 0, kept.Offset(i - i0, 0));
  }
  const int64_t first = i == i0 ? ahead : 0;
  const KeptSums rest = kept.Offset(i - i0, 0);
  switch (i1 - i) {
    case 3:
      RowStrip<3>(l, p, i, c0, c1, full, rem, first, rest);
      break;
    case 2:
      RowStrip<2>(l, p, i, c0, c1, full, rem, first, rest);
      break;
    case 1:
      RowStrip<1>(l, p, i, c0, c1, full, rem, first, rest);
      break;
    default:
      break;
  }
}

// Blocks of x rows that stay in L2 (~256 KiB) while chunks of 16 W rows (a few KiB..64 KiB, in
// L1/L2) stream past them, W read from memory once per block (once in total for m up to a few
// dozen rows): chunk(i0, i1, c0, c1) for each block and chunk.
inline int64_t XBlockRows(const Problem& p) {
  const int64_t mb = (int64_t{256} << 10) / (p.kp * 4);
  return mb < 4 ? 4 : mb & ~int64_t{3};
}
template <class F>
inline void XBlocksWChunks(const Problem& p, int64_t n0, int64_t n1, const F& chunk) {
  const int64_t mb = XBlockRows(p);
  for (int64_t i0 = 0; i0 < p.m; i0 += mb) {
    const int64_t i1 = i0 + mb < p.m ? i0 + mb : p.m;
    for (int64_t c0 = n0; c0 < n1; c0 += 16) chunk(i0, i1, c0, c0 + 16 < n1 ? c0 + 16 : n1);
  }
}

// Wide rows, where XBlocksWChunks's x blocks hold fewer than kSliceMinRows rows (K above 2048) and
// x has more rows than one of them: x blocks of kSliceRows rows, K in slices of kSliceBlocks blocks
// (an x block's slice, 256 KiB, stays in L2 while W streams past it), W in chunks of kSliceWRows
// rows whose lane accumulators (256 KiB) wait in memory between slices. W then streams from memory
// once per 64 x rows instead of once per 8 at K = 7168. Each accumulator takes the same FMAs in
// the same order: the same bits. Both threads, 512 x 4096 x K (kimi-bench's prefill.gemm with
// KIMI_ISA=avx512 on the AMX host, --repeats 5, binaries alternated, two runs each): K = 7168 194
// -> 253-258 GFLOP/s, K = 4096 240-245 -> 271-274 (K = 1024: 298-308); 32 x rows a block, 16 or 64
// blocks a slice, 128 or 256 W rows a chunk were within the noise of this; at K = 2048 slicing was
// level or slower (268-288 against 289-294), so it starts above. (The AVX2 kernels keep the cliff.)
constexpr int64_t kSliceMinRows = 32, kSliceRows = 64, kSliceBlocks = 32, kSliceWRows = 64;
template <class L>
void RangeWithSlices(const L& l, const Problem& p, int64_t n0, int64_t n1, int64_t full, int rem,
                     int64_t ahead) {
  auto* const kept = reinterpret_cast<__m512*>(ThreadScratch(kSliceRows * kSliceWRows * 16));
  for (int64_t i0 = 0; i0 < p.m; i0 += kSliceRows) {
    const int64_t i1 = std::min(p.m, i0 + kSliceRows);
    for (int64_t w0 = n0; w0 < n1; w0 += kSliceWRows) {
      const int64_t w1 = std::min(n1, w0 + kSliceWRows);
      for (int64_t b0 = 0; b0 < full; b0 += kSliceBlocks) {
        const int64_t b1 = std::min(full, b0 + kSliceBlocks);
        const bool last = b1 == full;
        for (int64_t c0 = w0; c0 < w1; c0 += 16) {
          const KeptSums k{kept + (c0 - w0), kSliceWRows, b0, last};
          RowStrips(l, p, i0, i1, c0, std::min(w1, c0 + 16), b1, last ? rem : 0, ahead, k);
        }
      }
    }
  }
}

template <class L>
void RangeWith(const L& l, const Problem& p, int64_t n0, int64_t n1) {
  const int64_t k = p.w->cols, full = k / 32;
  const int rem = static_cast<int>(k % 32);
  // Prefetch distance in rows: at least 8 KiB of weights ahead.
  const int64_t row_bytes = l.RowBytes();
  const int64_t ahead_rows = (8192 + row_bytes - 1) / row_bytes;
  if (p.m <= 3) {
    // Decode, or a few tokens, on row-major weights (packed ones take GroupStrips): 8 rows of W in
    // flight, every x row against each, with software prefetches ahead.
    const int64_t ahead = ahead_rows < 8 ? 8 : ahead_rows;
    const auto run = [&](auto mr) {
      constexpr int MR = decltype(mr)::value;
      int64_t n = n0;
      for (; n + 8 <= n1; n += 8) Tile<MR, 8>(l, p.xp, p.kp, p.y, p.ldy, n, full, rem, ahead);
      for (; n < n1; ++n) Tile<MR, 1>(l, p.xp, p.kp, p.y, p.ldy, n, full, rem);
    };
    if (p.m == 1) run(std::integral_constant<int, 1>{});
    if (p.m == 2) run(std::integral_constant<int, 2>{});
    if (p.m == 3) run(std::integral_constant<int, 3>{});
    return;
  }
  // Blocks of x rows in L2 while W's chunks stream past them (XBlocksWChunks). (Converting W chunks
  // once into an fp32 panel measured slower here: the panel's stores miss L1. MXFP4's decode costs
  // more; past the group strips it does take a panel: RangeMxfp4Panel.)
  const int64_t ahead = ahead_rows < 16 ? 16 : ahead_rows;
  if (const int64_t mb = XBlockRows(p); mb < kSliceMinRows && p.m > mb && full > kSliceBlocks) {
    return RangeWithSlices(l, p, n0, n1, full, rem, ahead);
  }
  XBlocksWChunks(p, n0, n1, [&](int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
    RowStrips(l, p, i0, i1, c0, c1, full, rem, ahead);
  });
}

// MXFP4 at more x rows than the group strips take (StripsFit): RangeWith's loops, with each chunk
// of 16 W rows decoded once into fp32 (the even / odd vectors Mxfp4PackedLoader gives, 2 KiB a row
// at K = 512) and the tiles reading that, where Tile decodes every weight once per four x rows (the
// decode's three shuffles a block beside eight FMAs). Tile's arithmetic on the same values: the
// same sums. k3-mini's experts in a 512-token prefill (--matmul_profile, binaries alternated), at
// 65-93 rows: 134.6-134.9 -> 170.6-170.8 GFLOP/s a thread; at 16-64 rows the group strips stay
// faster (149-167 against 123-142 through a panel). Up to K = kMxfp4PanelMaxCols, where the panel
// stays in L1/L2 (64 KiB); wider rows were not measured and keep Tile.
struct F32PanelLoader {
  const float* panel;  // rows [r0, r0 + 16), nb blocks each, (even, odd) per block
  int64_t r0, nb;
  KIMI_ALWAYS_INLINE void Load(int64_t r, int64_t b, __m512& e, __m512& o) const {
    const float* at = panel + ((r - r0) * nb + b) * 32;
    e = _mm512_loadu_ps(at);
    o = _mm512_loadu_ps(at + 16);
  }
  KIMI_ALWAYS_INLINE void Prefetch(int64_t, int64_t) const {}
  KIMI_ALWAYS_INLINE void LoadTail(int64_t, int64_t, int, __m512& e, __m512& o) const {
    e = _mm512_setzero_ps();
    o = _mm512_setzero_ps();
  }
};
constexpr int64_t kMxfp4PanelMaxCols = 1024;
void RangeMxfp4Panel(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  const int64_t nb = w.cols / 32;
  const Mxfp4PackedLoader src{static_cast<const uint8_t*>(w.data), w.scales, w.cols};
  thread_local std::vector<float> panel;
  if (static_cast<int64_t>(panel.size()) < 16 * nb * 32) panel.resize(16 * nb * 32);
  XBlocksWChunks(p, n0, n1, [&](int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
    for (int64_t r = c0; r < c1; ++r) {
      float* row = panel.data() + (r - c0) * nb * 32;
      for (int64_t b = 0; b < nb; ++b) {
        __m512 e, o;
        src.Load(r, b, e, o);
        _mm512_storeu_ps(row + b * 32, e);
        _mm512_storeu_ps(row + b * 32 + 16, o);
      }
    }
    RowStrips(F32PanelLoader{panel.data(), c0, nb}, p, i0, i1, c0, c1, nb, 0, 0);
  });
}

void Range(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  // Layouts packed for AVX2 (kernels/cpu/pack.h): the same bits from its kernels. kTiles never
  // comes here (matmul.cc routes it to the tile kernels or the scalar fallback).
  assert(!w.packed || w.layout != PackLayout::kTiles);
  if (w.packed && w.layout != PackLayout::kBlocks) return Avx2Kernels()->range(p, n0, n1);
  switch (w.format) {
    case WeightFormat::kBF16:
      if (w.packed && StripsFit(p)) {
        const auto* d = static_cast<const uint16_t*>(w.data);
        const int64_t nb = w.cols / 32;
        GroupStrips<Bf16Group>([&](int64_t n) { return Bf16Group{d + n * nb * 32}; }, p, n0, n1);
      } else if (w.packed) {
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
      if (w.packed && StripsFit(p)) {
        const auto* d = static_cast<const uint8_t*>(w.data);
        const int64_t nb = w.cols / 32;
        GroupStrips<Mxfp4Group>(
            [&](int64_t n) {
              return Mxfp4Group{d + n * nb * 16, w.scales + n * nb};
            },
            p, n0, n1);
      } else if (w.packed && w.cols <= kMxfp4PanelMaxCols) {
        RangeMxfp4Panel(p, n0, n1);
      } else if (w.packed) {
        RangeWith(Mxfp4PackedLoader{static_cast<const uint8_t*>(w.data), w.scales, w.cols}, p, n0,
                  n1);
      } else {
        RangeWith(Mxfp4Loader{static_cast<const uint8_t*>(w.data), w.scales, w.cols}, p, n0, n1);
      }
      return;
  }
}

// --- bf16 activations (opt-in): vdpbf16ps on bf16 weights, and on MXFP4 ones decoded to bf16 ---
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c,bmi,bmi2")

struct Bf16Raw {
  const uint16_t* base;
  int64_t k;
  bool packed;
  KIMI_ALWAYS_INLINE const uint16_t* At(int64_t r, int64_t b) const {
    return packed ? base + (r / kPackRows) * kPackRows * k + b * 32 * kPackRows + (r % kPackRows) * 32
                  : base + r * k + b * 32;
  }
  KIMI_ALWAYS_INLINE __m512i Load(int64_t r, int64_t b) const { return _mm512_loadu_si512(At(r, b)); }
  KIMI_ALWAYS_INLINE __m512i LoadTail(int64_t r, int64_t b, int rem) const {  // unpacked only
    return _mm512_maskz_loadu_epi16(_bzhi_u32(~0u, rem), At(r, b));
  }
};

// y[i, n + j] for i < MR, j < NR: MR rows of xb against NR rows of W by vdpbf16ps, the whole of K.
// The NR rows are read through one pointer: in a packed weight they lie side by side in every
// block (n % 4 == 0 when NR == 4, so they share a group), else a row apart. Four sums per x row go
// out through Reduce16 (the same bits as Reduce on each).
template <int MR, int NR>
inline void TileBf16(const Bf16Raw& l, const uint16_t* xb, int64_t kp, float* y, int64_t ldy,
                     int64_t n, int64_t full, int rem) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const auto dot = [&](const __m512i(&x)[MR], int j, __m512i w) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      acc[i][j] = _mm512_dpbf16_ps(acc[i][j], reinterpret_cast<__m512bh>(x[i]),
                                   reinterpret_cast<__m512bh>(w));
    }
  };
  const int64_t row_step = l.packed ? 32 : l.k, block_step = l.packed ? 32 * kPackRows : 32;
  const uint16_t* w = l.At(n, 0);
  const uint16_t* xr = xb;
  for (int64_t b = 0; b < full; ++b, w += block_step, xr += 32) {
    __m512i x[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) x[i] = _mm512_loadu_si512(xr + i * kp);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) dot(x, j, _mm512_loadu_si512(w + j * row_step));
  }
  if (rem) {  // unpacked weights only; x is zero-padded to kp
    __m512i x[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) x[i] = _mm512_loadu_si512(xb + i * kp + full * 32);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) dot(x, j, l.LoadTail(n + j, full, rem));
  }
  if constexpr (NR == 4 && MR <= 4) {
    StoreQuadSums<MR>(acc, y + n, ldy);
  } else if constexpr (NR == 4 && MR <= 8) {
    StoreQuadSums<4>(acc, y + n, ldy);
    StoreQuadSums<MR - 4>(acc + 4, y + 4 * ldy + n, ldy);
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = Reduce(acc[i][j]);
    }
  }
}

template <int MR>
inline void StripBf16(const Bf16Raw& l, const Problem& p, int64_t i0, int64_t n0, int64_t n1,
                      int64_t full, int rem) {
  const uint16_t* xb = p.xb + i0 * p.kp;
  float* y = p.y + i0 * p.ldy;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) TileBf16<MR, 4>(l, xb, p.kp, y, p.ldy, n, full, rem);
  for (; n < n1; ++n) TileBf16<MR, 1>(l, xb, p.kp, y, p.ldy, n, full, rem);
}

// acc[i][j] = x row i against row j of a packed group over the whole of K, by vdpbf16ps: the
// group's blocks as bf16 (Bf16Group's loads, or Mxfp4Group's decode) through one pointer, with
// the group's prefetch, as the fp32 group kernels.
// GroupDotsBlocks adds blocks [b0, b1) of group rows [j0, j0 + NR) to acc, prefetching as
// GroupBlocks does (its arguments in GroupBlocks' order).
template <int MR, int NR = kPackRows, bool kLater = false, class G>
KIMI_ALWAYS_INLINE void GroupDotsBlocks(const G& g, const uint16_t* xb, int64_t kp, int64_t b0,
                                        int64_t b1, int j0, __m512 (&acc)[MR][NR],
                                        const G* later = nullptr, int64_t shift = 0) {
  for (int64_t b = b0; b < b1; ++b) {
    __m512i x[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) x[i] = _mm512_loadu_si512(xb + i * kp + b * 32);
    if constexpr (kLater) {
      later->PrefetchBlock(b + shift);
    } else {
      g.Prefetch(b);
    }
    g.PrefetchPage(b);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m512i w = g.LoadBf16(b, j0 + j);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], reinterpret_cast<__m512bh>(x[i]),
                                     reinterpret_cast<__m512bh>(w));
      }
    }
  }
}
template <int MR, int NR = kPackRows, class G>
KIMI_ALWAYS_INLINE void GroupDots(const G& g, const uint16_t* xb, int64_t kp, int64_t nb, int j0,
                                  __m512 (&acc)[MR][NR]) {
#pragma GCC unroll 16
  for (int t = 0; t < MR * NR; ++t) (&acc[0][0])[t] = _mm512_setzero_ps();
  GroupDotsBlocks<MR, NR>(g, xb, kp, 0, nb, j0, acc);
}

// GroupsOneRow for bf16 x (paired passes, one cold thread, K = 2304-7168: 1.02-1.24x one group at a
// time; 2 threads 1.12-1.18x; K = 1024 level). Not for MXFP4 (its decode: 0.75-0.98x). A copy
// rather than GroupsOneRow taking the block loop as a parameter: that template is compiled under
// the fp32 kernels' target, which cannot inline this section's bf16 dot products.
template <class G>
KIMI_ALWAYS_INLINE void GroupsOneRowBf16(const G* g, const uint16_t* xb, int64_t nb, float* y) {
  constexpr int NG = G::kGroupsAtOnce;
  __m512 acc[NG][1][kPackRows];
#pragma GCC unroll 24
  for (int t = 0; t < NG * kPackRows; ++t) (&acc[0][0][0])[t] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
    const int64_t b1 = b0 + kChunkBlocks < nb ? b0 + kChunkBlocks : nb;
    constexpr int64_t ahead = G::kAheadBytes / (kChunkBlocks * G::kBlockBytes);
#pragma GCC unroll 3
    for (int t = 0; t < NG; ++t) {
      GroupDotsBlocks<1, kPackRows, true>(g[t], xb, 0, b0, b1, 0, acc[t], &g[(t + ahead) % NG],
                                          (t + ahead) / NG * kChunkBlocks);
    }
  }
#pragma GCC unroll 3
  for (int t = 0; t < NG; ++t) StoreGroupSums<1>(acc[t], y + t * kPackRows, 0);
}

// Every x row of the problem against one packed group, y[i, 0 .. kPackRows) at y + i * ldy:
// strips of three x rows (24 accumulators) against the whole group, so the group streams from
// memory once and stays in L1 for the other strips. A group whose prefetches are spread over those
// strips (Bf16Group::SpreadOver, GroupStripsBf16) moves on to the next pass after each.
constexpr int StripsOfThree(int64_t m) { return static_cast<int>((m + 2) / 3); }
template <class G>
inline void GroupRowsBf16(G g, const Problem& p, int64_t nb, float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 3 <= p.m; i += 3) {
    __m512 acc[3][kPackRows];
    GroupDots<3>(g, p.xb + i * p.kp, p.kp, nb, 0, acc);
    StoreGroupSums<2>(acc, y + i * ldy, ldy);
    StoreGroupSums<1>(acc + 2, y + (i + 2) * ldy, ldy);
    if constexpr (G::kSpreadsPrefetch) ++g.spread.pass;
  }
  if (p.m - i == 2) {
    __m512 acc[2][kPackRows];
    GroupDots<2>(g, p.xb + i * p.kp, p.kp, nb, 0, acc);
    StoreGroupSums<2>(acc, y + i * ldy, ldy);
  } else if (p.m - i == 1) {
    __m512 acc[1][kPackRows];
    GroupDots<1>(g, p.xb + i * p.kp, p.kp, nb, 0, acc);
    StoreGroupSums<1>(acc, y + i * ldy, ldy);
  }
}

// Packed bf16 W rows [n0, n1) against m bf16 x rows (StripsFit), group after group. TileBf16
// read these shapes without a prefetch and four rows at a time: a batch-8 kimi-linear-small step
// with bf16 activations was slower than with fp32 ones. Where the spread prefetches go to L2
// (kPrefetchAheadToL2: Zen 4), a group read in several strips spreads them as the fp32 path does;
// steps alternated every ten in one process on a 2-vCPU Zen 4 host (median of 6 per-pair ratios):
// kimi-linear-small batch 8 / 32 / 64 0.89 / 0.87 / 0.91 of the time, k3-mini 0.88 / 0.97 / 0.99
// (spread with T0 lines there: 0.98 / 0.93 / -, 0.94 / - / 0.98). On Zen 5, with T0, spreading
// here was slower (see Bf16Group::SpreadOver).
inline void GroupStripsBf16(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t nb = p.w->cols / 32;
  const auto* d = static_cast<const uint16_t*>(p.w->data);
  int64_t n = n0;
  constexpr int NG = Bf16Group::kGroupsAtOnce;
  if (p.m == 1 && nb >= kGroupsOneRowMinBlocks) {
    for (; n + NG * kPackRows <= n1; n += NG * kPackRows) {
      Bf16Group g[NG];
      for (int t = 0; t < NG; ++t) g[t] = Bf16Group{d + (n + t * kPackRows) * nb * 32};
      GroupsOneRowBf16(g, p.xb, nb, p.y + n);
    }
  }
  const int passes = StripsOfThree(p.m);
  for (; n < n1; n += kPackRows) {
    Bf16Group g{d + n * nb * 32};
    g.prefetch = PrefetchGroup<Bf16Group>(p, n0, n);
    g.ToL2(p.m);
    if (g.to_l2 && passes > 1) g.SpreadOver(passes, nb);  // spread only with the lines in L2
    GroupRowsBf16(g, p, nb, p.y + n, p.ldy);
  }
}

// x rows [i, i + MR) against rows [j0, j0 + NR) of a packed MXFP4 group on the bf16 path (a
// strip), the sums to y + i * ldy + j0.
template <int MR, int NR>
KIMI_ALWAYS_INLINE void Mxfp4StripBf16(const Mxfp4Group g, const Problem& p, int64_t nb, int64_t i,
                                       int j0, float* y) {
  __m512 acc[MR][NR];
  GroupDots<MR, NR>(g, p.xb + i * p.kp, p.kp, nb, j0, acc);
  StoreStripSums<MR, NR>(acc, y + i * p.ldy + j0, p.ldy);
}

// Every x row (m >= 4) against one packed MXFP4 group on the bf16 path, in ForEachStrip's strips
// (of four x rows against each half of the group, so that a code is decoded once per four rows,
// not three; the last one or two rows against the whole group). Restated here because
// ForEachStrip, compiled for the fp32 kernels' target, cannot inline this section's dot products.
inline void Mxfp4QuadStripsBf16(const Mxfp4Group g, const Problem& p, int64_t nb, float* y) {
  const int64_t quads = p.m / 4 * 4, rest = p.m - quads;  // rows in strips of four, and after
  for (int j0 = 0; j0 < kPackRows; j0 += 4) {
    for (int64_t i = 0; i < quads; i += 4) Mxfp4StripBf16<4, 4>(g, p, nb, i, j0, y);
    if (rest == 3) Mxfp4StripBf16<3, 4>(g, p, nb, quads, j0, y);
  }
  if (rest == 2) Mxfp4StripBf16<2, kPackRows>(g, p, nb, quads, 0, y);
  if (rest == 1) Mxfp4StripBf16<1, kPackRows>(g, p, nb, quads, 0, y);
}

// MXFP4 W rows [n0, n1) (packed kBlocks or not; K % 32 == 0) on the bf16 path, group after group.
// Up to kMaxStripRows x rows, every strip decodes the codes in its loop: one to three rows as one
// strip against the whole group, four or more in strips of four against each half of it
// (Mxfp4QuadStripsBf16; on the Zen 5 host, strips of three everywhere, one thread, in cache, 1024 x
// 1024 at m = 4 / 8 / 16 took 40 / 69 / 136 us, where decoding each group once into scratch for
// all strips took 61 / 85 / 132, and the fp32 path 44 / 89 / 218). On the 2-vCPU Zen 4 host, one
// thread, strips of four against strips of three: K3's expert shape 512 x 256 (256 of them, from
// L3) at m = 4 / 6 / 8 / 16 7.3 / 12.3 / 14.8 / 29.4-30.8 us against 10.4 / 13.0 / 18.0 / 36.2;
// 1024 x 1024 in cache 49 / 86 / 99 / 200 against 72-75 / 88 / 125 / 251. At m = 3 two 3 x 4
// strips took 7.9 us against one 3 x 8 strip's 6.6; 5 x 4 strips were no faster than 4 x 4 and a
// 1 x 8 (11.6 against 11.2 us at m = 5), 6 x 4 ones (more accumulators and x vectors than
// registers) 2x slower. Steps alternated every ten in one process (median of 8 / 8 / 4 per-pair
// ratios): k3-mini with bf16 activations at batch 8 / 32 / 64 0.999 / 0.979 / 0.967 of the time.
// More rows decode the group once into per-thread scratch in Bf16Group's layout, which every strip
// then reads (1024 x 1024 at m = 17-24: 11.4-11.8 us a row against 12.6 for strips of four at 16;
// 512 x 256 1.8-1.9 against 1.8); so do an unpacked weight's groups, and a last partial one, padded
// with zero rows whose sums are dropped. The weights are the same bf16 values either way.
void Mxfp4StripsBf16(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  const int64_t nb = w.cols / 32;
  const auto* d = static_cast<const uint8_t*>(w.data);
  if (w.packed && p.m <= kMaxStripRows) {  // packed: n0 % kPackRows == 0, whole groups
    for (int64_t n = n0; n < n1; n += kPackRows) {
      Mxfp4Group g{d + n * nb * 16, w.scales + n * nb};
      g.prefetch = PrefetchGroup<Mxfp4Group>(p, n0, n);
      if (p.m <= 3) {
        GroupRowsBf16(g, p, nb, p.y + n, p.ldy);
      } else {
        Mxfp4QuadStripsBf16(g, p, nb, p.y + n);
      }
    }
    return;
  }
  // The decoded group (nb blocks of kPackRows x 32 bf16), then a partial group's sums.
  const int64_t group_floats = nb * kPackRows * 16;
  float* scratch = ThreadScratch(group_floats + p.m * kPackRows);
  uint16_t* decoded = reinterpret_cast<uint16_t*>(scratch);  // written and read by intrinsics only
  float* sums = scratch + group_floats;
  for (int64_t n = n0; n < n1; n += kPackRows) {
    const int64_t rows = n1 - n < kPackRows ? n1 - n : kPackRows;
    for (int64_t b = 0; b < nb; ++b) {
      for (int j = 0; j < kPackRows; ++j) {
        __m512i v = _mm512_setzero_si512();
        if (j < rows) {
          const int64_t r = n + j;
          const int64_t unit = w.packed ? (r / kPackRows) * kPackRows * nb + b * kPackRows + j
                                        : r * nb + b;  // block (r, b): 16 code bytes, one scale
          v = DecodeMxfp4Bf16(d + unit * 16, w.scales[unit]);
        }
        _mm512_storeu_si512(decoded + (b * kPackRows + j) * 32, v);
      }
    }
    if (rows == kPackRows) {
      GroupRowsBf16(Bf16Group{decoded}, p, nb, p.y + n, p.ldy);
    } else {
      GroupRowsBf16(Bf16Group{decoded}, p, nb, sums, kPackRows);
      for (int64_t i = 0; i < p.m; ++i) {
        for (int64_t j = 0; j < rows; ++j) p.y[i * p.ldy + n + j] = sums[i * kPackRows + j];
      }
    }
  }
}

void RangeBf16(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  // matmul.cc keeps lane-major weights (kLanes, kPairs) on the fp32 path.
  assert(!w.packed || w.layout == PackLayout::kBlocks);
  if (w.format == WeightFormat::kMxfp4) return Mxfp4StripsBf16(p, n0, n1);
  if (w.packed && StripsFit(p)) return GroupStripsBf16(p, n0, n1);
  const Bf16Raw l{static_cast<const uint16_t*>(w.data), w.cols, w.packed};
  const int64_t full = w.cols / 32;
  const int rem = static_cast<int>(w.cols % 32);
  // As the fp32 path: blocks of x rows held in L2, W in chunks of 16 rows read once per block.
  int64_t mb = (int64_t{128} << 10) / (p.kp * 2);
  mb = mb < 4 ? 4 : mb & ~int64_t{3};
  for (int64_t i0 = 0; i0 < p.m; i0 += mb) {
    const int64_t i1 = i0 + mb < p.m ? i0 + mb : p.m;
    for (int64_t c0 = n0; c0 < n1; c0 += 16) {
      const int64_t c1 = c0 + 16 < n1 ? c0 + 16 : n1;
      int64_t i = i0;
      for (; i + 6 <= i1; i += 6) StripBf16<6>(l, p, i, c0, c1, full, rem);
      for (; i + 4 <= i1; i += 4) StripBf16<4>(l, p, i, c0, c1, full, rem);
      switch (i1 - i) {
        case 5:
          StripBf16<5>(l, p, i, c0, c1, full, rem);
          break;
        case 3:
          StripBf16<3>(l, p, i, c0, c1, full, rem);
          break;
        case 2:
          StripBf16<2>(l, p, i, c0, c1, full, rem);
          break;
        case 1:
          StripBf16<1>(l, p, i, c0, c1, full, rem);
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

#pragma GCC pop_options

const Kernels* Avx512Kernels() {
  static const bool bf16 = __builtin_cpu_supports("avx512bf16");
  static const Kernels k{"avx512", &Range, bf16 ? &RangeBf16 : nullptr};
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok ? &k : nullptr;
}

}  // namespace kimi::cpu::matmul_internal
