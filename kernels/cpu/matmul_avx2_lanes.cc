// MatMul on lane-major packed weights (kernels/cpu/pack.h) for AVX2 + FMA: outer-product tiles.
//
// In the lane-major layout one 32-byte load holds canonical lane J of one block for the 8 rows of
// a group (bf16: the pair of columns 2J, 2J + 1 of each row; MXFP4: 8 code bytes), so a vector
// of 8 outputs' partial sums for lane J is built by broadcasting x's two elements of that lane:
//   acc[i][g] = fma(x[i, 32b + 2J], W_g[lane J, block b, even], acc[i][g]),  then the odd element,
// block after block: exactly the fused multiply-adds, in the order, of the canonical sum
// (matmul_impl.h), so results equal every other path bit for bit. The 16 lane sums of each
// output are then added pairwise on whole vectors.
//
// A tile holds MR x rows against NG groups (MR * NG <= 12 accumulators, the rest of AVX2's 16
// registers for the weights and x); the x broadcasts are loads, which Zen 3 issues beside the two
// FMA pipes. One lane at a time, a tile reads NG contiguous runs of weights (one per group), which
// suits the hardware prefetcher at every m, batch-1 decode included. bf16 products of 2 or more x
// rows, at every m, go through TwoRowTile, which keeps x's broadcasts in registers (it replaced
// matmul_avx2.cc's fp32 panel here: 1.0-1.2x its speed at K <= 1024 and about 2x at K >= 2048,
// where the panel's x rows no longer stay in L2). MXFP4 weights are packed lane-major only when a
// caller asks (tests); PreferredPackLayout gives them kPairs (matmul_avx2.cc).
// GCC 12 reports its own _mm256_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul_impl.h"
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#include "kernels/cpu/matmul_avx2_common.h"

namespace kimi::cpu::matmul_internal {
namespace {

using avx2::Bf16Split;
using avx2::WithRemainder;

constexpr int64_t G = kPackRows;  // rows per group: one vector of outputs
constexpr int kTileGroups = 24;  // MXFP4: groups whose weights and scales stay in L2 for all strips

// --- Cursors: groups [g0, g0 + NG) of a weight ------------------------------------------------
// Run(g, lane) is lane J of group g over all blocks; Load(run, b, e, o) its block b as even / odd
// fp32. A tile takes its NG runs once per lane, so the inner loop only adds b to NG pointers.

struct Bf16Cursor {
  const uint16_t* group;  // group g0
  int64_t group_stride;   // uint16 units per group
  int64_t nb;
  struct LaneRun {
    const uint16_t* p;
  };
  KIMI_ALWAYS_INLINE LaneRun Run(int g, int64_t lane) const {
    return {group + g * group_stride + lane * nb * 2 * G};
  }
  KIMI_ALWAYS_INLINE Bf16Cursor Advance(int64_t g) const {
    return {group + g * group_stride, group_stride, nb};
  }
  KIMI_ALWAYS_INLINE static void Load(const LaneRun& r, int64_t b, __m256& e, __m256& o) {
    Bf16Split::Apply(r.p + b * 2 * G, e, o);
  }
};

// MXFP4: E2M1 magnitude from the code's low 3 bits (vpermps over the 8 magnitudes), times the
// row's scale, sign from bit 3. The 8 rows' scales differ, so they come as a vector of fp32
// 2^(s - 127), converted once per tile (`scales`: [group][block][row]).
struct Mxfp4Cursor {
  const uint8_t* group;  // group g0's codes
  int64_t group_stride;  // bytes per group
  int64_t nb;
  const float* scales;  // group g0's converted scales
  struct LaneRun {
    const uint8_t* p;
    const float* s;
  };
  KIMI_ALWAYS_INLINE LaneRun Run(int g, int64_t lane) const {
    return {group + g * group_stride + lane * nb * G, scales + g * nb * G};
  }
  KIMI_ALWAYS_INLINE Mxfp4Cursor Advance(int64_t g) const {
    return {group + g * group_stride, group_stride, nb, scales + g * nb * G};
  }
  KIMI_ALWAYS_INLINE static void Load(const LaneRun& r, int64_t b, __m256& e, __m256& o) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    const __m256i c =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r.p + b * G)));
    const __m256i c_odd = _mm256_srli_epi32(c, 4);
    const __m256 s = _mm256_load_ps(r.s + b * G);
    e = _mm256_xor_ps(_mm256_mul_ps(_mm256_permutevar8x32_ps(mag, c), s),
                      _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 28), sign)));
    o = _mm256_xor_ps(_mm256_mul_ps(_mm256_permutevar8x32_ps(mag, c_odd), s),
                      _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c_odd, 28), sign)));
  }
};

// --- The tiles ---------------------------------------------------------------------------------

// y[i, 8g + j] = the canonical sum of the 16 lane sums sums[lane][i][g][j] (i < rows, g < groups):
// lanes J += J + w for w = 8, 4, 2, 1, on 8 outputs at a time.
template <int MR, int NG>
KIMI_ALWAYS_INLINE void SumLanes(const float (&sums)[16][MR][NG][G], float* y, int64_t ldy,
                                 int rows = MR, int groups = NG) {
  for (int i = 0; i < rows; ++i) {
    for (int g = 0; g < groups; ++g) {
      __m256 p[16];
#pragma GCC unroll 16
      for (int lane = 0; lane < 16; ++lane) p[lane] = _mm256_load_ps(sums[lane][i][g]);
#pragma GCC unroll 8
      for (int w = 8; w >= 1; w /= 2) {
#pragma GCC unroll 8
        for (int lane = 0; lane < w; ++lane) p[lane] = _mm256_add_ps(p[lane], p[lane + w]);
      }
      _mm256_storeu_ps(y + i * ldy + g * G, p[0]);
    }
  }
}

// One line of lane `lane`'s run of each of the NG groups one tile on: that page's address
// translation is then in the TLB before the tile reaches it (as the AVX-512 kernels'
// PrefetchPageAhead). On the Zen 5 host under KIMI_ISA=avx2 (a virtual machine, where a plain
// stream stalls on a page walk every 4 KiB), steps alternated every ten in one process: LaneTile's
// batch-1 kimi-linear-small 0.91, with the kPairs MXFP4 tile's touch (matmul_avx2.cc GroupTile)
// k3-mini 0.95, batch-8 kimi-linear-small 0.96; TwoRowTile's then batch-8 / 32 kimi-linear-small
// 0.96 / 0.98, batch-8 k3-mini 1.00.
template <int NG, class C>
KIMI_ALWAYS_INLINE void TouchNextTile(const C& c, int64_t lane) {
#pragma GCC unroll 12
  for (int g = 0; g < NG; ++g) {
    _mm_prefetch(reinterpret_cast<const char*>(c.Run(g, lane).p + NG * c.group_stride),
                 _MM_HINT_T0);
  }
}

// y[i, 8g + j] for i < MR, g < NG, j < 8. xl: x rows in lane-major order (row stride ldx): lane
// J's elements of block b at (J * nb + b) * 2 (even) and + 1 (odd).
template <int MR, int NG, class C>
inline void LaneTile(const C c, int64_t nb, const float* xl, int64_t ldx, float* y, int64_t ldy) {
  alignas(32) float sums[16][MR][NG][G];
  for (int64_t lane = 0; lane < 16; ++lane) {
    __m256 acc[MR][NG];
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 12
      for (int g = 0; g < NG; ++g) acc[i][g] = _mm256_setzero_ps();
    }
    typename C::LaneRun runs[NG];
#pragma GCC unroll 12
    for (int g = 0; g < NG; ++g) runs[g] = c.Run(g, lane);
    TouchNextTile<NG>(c, lane);
    const float* xj = xl + lane * nb * 2;
    for (int64_t b = 0; b < nb; ++b) {
#pragma GCC unroll 12
      for (int g = 0; g < NG; ++g) {
        __m256 e, o;
        C::Load(runs[g], b, e, o);
        // Broadcast x again for every group (a volatile barrier, so GCC cannot merge them): kept
        // in registers across the groups, the 2 MR broadcasts push accumulators onto the stack.
        const float* x = xj + 2 * b;
        if constexpr (NG > 1) __asm__ volatile("" : "+r"(x));
#pragma GCC unroll 12
        for (int i = 0; i < MR; ++i) {
          const __m256 xe = _mm256_broadcast_ss(x + i * ldx);
          const __m256 xo = _mm256_broadcast_ss(x + i * ldx + 1);
          acc[i][g] = _mm256_fmadd_ps(xe, e, acc[i][g]);
          acc[i][g] = _mm256_fmadd_ps(xo, o, acc[i][g]);
        }
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 12
      for (int g = 0; g < NG; ++g) _mm256_store_ps(sums[lane][i][g], acc[i][g]);
    }
  }
  SumLanes<MR, NG>(sums, y, ldy);
}

// Two x rows against kTwoRowGroups groups of bf16 weights, x's four broadcasts of a block kept in
// registers: 10 accumulators, 4 broadcasts and the block's even and odd weights fill AVX2's 16
// registers. A block then costs 4 broadcasts, 5 weight loads and 5 mask loads for 20 FMAs, where
// LaneTile<4, 3> (which broadcasts x again for every group, see above) issues 30 loads for 24 and
// is bound by the load ports: in L2, one thread, 82 GFLOP/s against 53 (a probe at K = 512; the
// FMA peak is about 98). Written with intrinsics GCC spills some of the 16 live vectors, so the
// block loop is assembly. Its FMAs are LaneTile's, in the same order (x's even element, then the
// odd one, block after block, per lane), so the results are the same bits.
constexpr int kTwoRowGroups = 5;
alignas(32) constexpr uint32_t kOddHalves[8] = {0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u,
                                                0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u};

// Group K of the tile, when the tile has more than K groups: the 16 bf16 of lane J at ADDR as even
// (ymm14) and odd (ymm15) fp32, then x row 0's (ymm10, ymm11) and row 1's (ymm12, ymm13) elements
// into the accumulators ACC0 and ACC1.
// clang-format off
#define KIMI_TWO_ROW_GROUP(K, ADDR, ACC0, ACC1)  \
  ".if %c[ng] > " #K "\n\t"                     \
  "vmovdqu " ADDR ", %%ymm14\n\t"               \
  "vpand %[odd], %%ymm14, %%ymm15\n\t"          \
  "vpslld $16, %%ymm14, %%ymm14\n\t"            \
  "vfmadd231ps %%ymm10, %%ymm14, %%" ACC0 "\n\t" \
  "vfmadd231ps %%ymm12, %%ymm14, %%" ACC1 "\n\t" \
  "vfmadd231ps %%ymm11, %%ymm15, %%" ACC0 "\n\t" \
  "vfmadd231ps %%ymm13, %%ymm15, %%" ACC1 "\n\t" \
  ".endif\n\t"
// clang-format on

// y[i, 8g + j] for i < rows (even, <= kTwoRowRows), g < NG (<= kTwoRowGroups), j < 8; other
// arguments as LaneTile's. Lane after lane, every pair of rows passes the lane's runs of the NG
// groups (NG x nb x 32 bytes, in L1 for K up to about 4096), so the weights come from memory once
// for all the rows. Fewer than 5 groups (the end of a range) leave accumulators unused.
constexpr int kTwoRowRows = 16;
template <int NG>
inline void TwoRowTile(const Bf16Cursor c, int64_t nb, const float* xl, int64_t ldx, int64_t rows,
                       float* y, int64_t ldy) {
  alignas(32) float sums[16][kTwoRowRows][kTwoRowGroups][G];
  const int64_t group_bytes = c.group_stride * 2;
  const int64_t ldx_bytes = ldx * 4;
  for (int64_t lane = 0; lane < 16; ++lane) {
    TouchNextTile<NG>(c, lane);
    for (int64_t i = 0; i < rows; i += 2) {
      const uint16_t* run0 = c.Run(0, lane).p;  // groups 0-2: run0 + {0, 1, 2} * group_bytes
      // groups 3-4: run3 + {0, 1} * group_bytes
      const uint16_t* run3 = NG > 3 ? c.Run(3, lane).p : run0;
      const float* x = xl + i * ldx + lane * nb * 2;
      int64_t blocks = nb;  // >= 1: packed weights have whole blocks
      // Accumulators: ymm0-4 row i against groups 0-4, ymm5-9 row i + 1.
      // clang-format off
      __asm__ volatile(
          "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
          "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
          "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"
          "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"
          "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
          "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
          "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
          "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
          "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
          "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
          "1:\n\t"
          "vbroadcastss (%[x]), %%ymm10\n\t"
          "vbroadcastss 4(%[x]), %%ymm11\n\t"
          "vbroadcastss (%[x], %[ldx]), %%ymm12\n\t"
          "vbroadcastss 4(%[x], %[ldx]), %%ymm13\n\t"
          KIMI_TWO_ROW_GROUP(0, "(%[run0])", "ymm0", "ymm5")
          KIMI_TWO_ROW_GROUP(1, "(%[run0], %[gb])", "ymm1", "ymm6")
          KIMI_TWO_ROW_GROUP(2, "(%[run0], %[gb], 2)", "ymm2", "ymm7")
          KIMI_TWO_ROW_GROUP(3, "(%[run3])", "ymm3", "ymm8")
          KIMI_TWO_ROW_GROUP(4, "(%[run3], %[gb])", "ymm4", "ymm9")
          "add $32, %[run0]\n\t"
          "add $32, %[run3]\n\t"
          "add $8, %[x]\n\t"
          "dec %[blocks]\n\t"
          "jnz 1b\n\t"
          "vmovaps %%ymm0, (%[out])\n\t"
          "vmovaps %%ymm1, 32(%[out])\n\t"
          "vmovaps %%ymm2, 64(%[out])\n\t"
          "vmovaps %%ymm3, 96(%[out])\n\t"
          "vmovaps %%ymm4, 128(%[out])\n\t"
          "vmovaps %%ymm5, 160(%[out])\n\t"
          "vmovaps %%ymm6, 192(%[out])\n\t"
          "vmovaps %%ymm7, 224(%[out])\n\t"
          "vmovaps %%ymm8, 256(%[out])\n\t"
          "vmovaps %%ymm9, 288(%[out])\n\t"
          : [run0] "+r"(run0), [run3] "+r"(run3), [x] "+r"(x), [blocks] "+r"(blocks)
          : [gb] "r"(group_bytes), [ldx] "r"(ldx_bytes), [out] "r"(&sums[lane][i][0][0]),
            [ng] "i"(NG), [odd] "m"(*reinterpret_cast<const __m256i*>(kOddHalves))
          : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
            "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
      // clang-format on
    }
  }
  SumLanes<kTwoRowRows, kTwoRowGroups>(sums, y, ldy, static_cast<int>(rows), NG);
}
#undef KIMI_TWO_ROW_GROUP

// Groups per tile for MR x rows: MR * NG accumulators, at most 12 (8 for one row: the batch-1
// stream then reads 8 runs at once, enough to cover the FMA latency).
constexpr int GroupsFor(int mr) {
  return mr == 1 ? 8 : mr == 2 ? 6 : mr == 3 ? 4 : mr == 4 ? 3 : 2;
}
constexpr int kMaxStripRows = 4;

// MR x rows against groups [0, groups) of the cursor's tile: tiles of GroupsFor(MR) groups, then
// one narrower tile for the rest.
template <int MR, class Cur>
KIMI_ALWAYS_INLINE void Strip(const Cur& cur, int64_t groups, int64_t nb, const float* xl,
                              int64_t ldx, float* y, int64_t ldy) {
  constexpr int NG = GroupsFor(MR);
  int64_t g = 0;
  for (; g + NG <= groups; g += NG) {
    LaneTile<MR, NG>(cur.Advance(g), nb, xl, ldx, y + g * G, ldy);
  }
  WithRemainder<NG>(groups - g, [&](auto ng) {
    LaneTile<MR, decltype(ng)::value>(cur.Advance(g), nb, xl, ldx, y + g * G, ldy);
  });
}

// x rows [0, m) against the cursor's `groups` groups: strips of kMaxStripRows rows, then one
// shorter strip.
template <class Cur>
void TileRows(const Cur& cur, int64_t groups, int64_t nb, const float* xl, int64_t ldx, int64_t m,
              float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + kMaxStripRows <= m; i += kMaxStripRows) {
    Strip<kMaxStripRows>(cur, groups, nb, xl + i * ldx, ldx, y + i * ldy, ldy);
  }
  WithRemainder<kMaxStripRows>(m - i, [&](auto mr) {
    Strip<decltype(mr)::value>(cur, groups, nb, xl + i * ldx, ldx, y + i * ldy, ldy);
  });
}

// bf16, m >= 2: each tile of kTwoRowGroups groups (fewer at the end of the range) serves every pair
// of x rows, and a last odd row, while its weights are in L1 / L2, so they stream from memory once,
// spread evenly over the compute.
template <int NG>
void TwoRowGroups(const Bf16Cursor& c, int64_t nb, const float* xl, int64_t ldx, int64_t m,
                  float* y, int64_t ldy) {
  int64_t i = 0;
  while (m - i >= 2) {
    const int64_t rows = std::min<int64_t>(kTwoRowRows, (m - i) & ~int64_t{1});
    TwoRowTile<NG>(c, nb, xl + i * ldx, ldx, rows, y + i * ldy, ldy);
    i += rows;
  }
  if (i < m) LaneTile<1, NG>(c, nb, xl + i * ldx, ldx, y + i * ldy, ldy);
}

void TwoRowStrips(const Bf16Cursor& cur, int64_t groups, int64_t nb, const float* xl, int64_t ldx,
                  int64_t m, float* y, int64_t ldy) {
  int64_t g = 0;
  for (; g + kTwoRowGroups <= groups; g += kTwoRowGroups) {
    TwoRowGroups<kTwoRowGroups>(cur.Advance(g), nb, xl, ldx, m, y + g * G, ldy);
  }
  WithRemainder<kTwoRowGroups>(groups - g, [&](auto ng) {
    TwoRowGroups<decltype(ng)::value>(cur.Advance(g), nb, xl, ldx, m, y + g * G, ldy);
  });
}

// xl[i][(J * nb + b) * 2 + q] = x[i, 32b + 2J + q], from the canonical xp (matmul_impl.h).
void ToLaneMajor(const Problem& p, int64_t nb, float* xl) {
  for (int64_t i = 0; i < p.m; ++i) {
    const float* xp = p.xp + i * p.kp;
    float* out = xl + i * p.kp;
    for (int64_t lane = 0; lane < 16; ++lane) {
      for (int64_t b = 0; b < nb; ++b) {
        out[(lane * nb + b) * 2] = xp[b * 32 + lane];
        out[(lane * nb + b) * 2 + 1] = xp[b * 32 + 16 + lane];
      }
    }
  }
}

}  // namespace

void LaneMajorRangeAvx2(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  const int64_t nb = w.cols / 32;  // packed: cols % 32 == 0, so p.kp == w.cols
  thread_local std::vector<float> xl_buffer, scale_buffer;
  thread_local uint64_t xl_serial = 0;  // the call whose x xl_buffer holds
  if (p.x_serial == 0 || p.x_serial != xl_serial) {
    if (static_cast<int64_t>(xl_buffer.size()) < p.m * p.kp) xl_buffer.resize(p.m * p.kp);
    ToLaneMajor(p, nb, xl_buffer.data());
    xl_serial = p.x_serial;
  }
  const float* xl = xl_buffer.data();
  if (w.format == WeightFormat::kMxfp4 &&
      static_cast<int64_t>(scale_buffer.size()) < kTileGroups * nb * G + 8) {
    scale_buffer.resize(kTileGroups * nb * G + 8);
  }
  // 32-byte aligned for the scale loads.
  float* scales =
      scale_buffer.data() + (8 - (reinterpret_cast<uintptr_t>(scale_buffer.data()) / 4) % 8) % 8;

  // Blocks of x rows that stay in L2 while every tile of groups passes all their strips.
  int64_t mb = (int64_t{256} << 10) / (p.kp * 4);
  mb = mb < kMaxStripRows ? kMaxStripRows : mb / kMaxStripRows * kMaxStripRows;
  for (int64_t i0 = 0; i0 < p.m; i0 += mb) {
    const int64_t rows = std::min(mb, p.m - i0);
    if (w.format == WeightFormat::kBF16) {
      // The whole range at once: TwoRowStrips reuses each tile's weights across its rows, and one
      // row (batch 1) reads every weight once whatever the blocking.
      const Bf16Cursor cur{static_cast<const uint16_t*>(w.data) + n0 * w.cols, G * w.cols, nb};
      float* y = p.y + i0 * p.ldy + n0;
      if (rows >= 2) {
        TwoRowStrips(cur, (n1 - n0) / G, nb, xl + i0 * p.kp, p.kp, rows, y, p.ldy);
      } else {
        TileRows(cur, (n1 - n0) / G, nb, xl + i0 * p.kp, p.kp, rows, y, p.ldy);
      }
      continue;
    }
    // MXFP4: tiles of kTileGroups groups, their scales converted once for all the rows.
    for (int64_t g0 = n0 / G; g0 < n1 / G; g0 += kTileGroups) {
      const int64_t groups = n1 / G - g0 < kTileGroups ? n1 / G - g0 : kTileGroups;
      const uint8_t* s = w.scales + g0 * nb * G;
      for (int64_t t = 0; t < groups * nb * G; ++t) scales[t] = kE8m0[s[t]];
      const Mxfp4Cursor cur{static_cast<const uint8_t*>(w.data) + g0 * G * (w.cols / 2),
                            G * (w.cols / 2), nb, scales};
      TileRows(cur, groups, nb, xl + i0 * p.kp, p.kp, rows, p.y + i0 * p.ldy + g0 * G, p.ldy);
    }
  }
}

}  // namespace kimi::cpu::matmul_internal

#pragma GCC pop_options
