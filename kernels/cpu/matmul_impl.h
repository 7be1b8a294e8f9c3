// Private to kernels/cpu: the MatMul kernels of each instruction set behind one table.
//
// The canonical summation order (every path computes exactly this, so a result never depends on
// m, on the tile an output lands in, or on the thread split; AVX-512 and AVX2 agree bit for bit):
//   K is zero-padded to Kp = 32 * ceil(K / 32). Block b holds elements [32b, 32b + 32). Lane j
//   (0..15) of a 16-lane accumulator takes, block after block,
//       acc[j] = fma(x[32b + 2j], w[32b + 2j], acc[j]);  acc[j] = fma(x[32b + 2j + 1], w[...], acc[j])
//   and the 16 lanes are then summed pairwise: acc[j] += acc[j + w] for w = 8, 4, 2, 1.
//   MXFP4 weights enter as the exact fp32 product E2M1(code) * 2^(scale - 127).
// The even/odd split matches how the stored formats unpack: a bf16 pair in one 32-bit word, two
// E2M1 codes in one byte. To make it a plain vector load, x is first permuted per 32-block into
// [16 even elements | 16 odd elements] ("xp", row stride Kp), zero-padded.
// The scalar fallback uses the same order without fused multiply-add (machines without FMA).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/weight.h"

namespace kimi::cpu {
class ThreadPool;
}

namespace kimi::cpu::matmul_internal {

struct Problem {
  float* y;
  int64_t ldy;
  const float* xp;  // [m, kp], permuted and padded (see above); fp32 activations
  int64_t kp;
  const Weight* w;
  int64_t m;
  const uint16_t* xb = nullptr;  // [m, kp] bf16 activations in natural order, zero-padded
  // Distinct for every MatMulMany call (0: unknown), so a kernel may keep a per-thread copy of x
  // in its own layout across the ranges of one call instead of converting it for each.
  uint64_t x_serial = 0;
  // [panels][kp / 32][P][3][32], for the AMX kernels' fp32 path: fp32 activations split exactly
  // into three bf16 terms (SplitRowToBf16x3), in panels of P = XtPanelRows(m) rows (the last one
  // partly used), each block after block of 32 columns, each row's hi, mid, lo one after another
  // in a block: column c of row i's term t at XtRowOffset(i, m, kp) + c / 32 * XtBlockStride(m) + t
  // * 32 + c % 32 (so a subset of rows cannot be handed on by moving the pointer, as p.xb's can).
  // An AMX tile of 16 rows of a term is then 16 lines 192 bytes apart, and one of 5 rows' three
  // terms 15 adjacent lines (matmul_amx.cc's XRows has what the row-major [m][3][kp] before it
  // cost, and why panels).
  const uint16_t* xt = nullptr;
};

// Computes y[i, n] for all i < m and n in [n0, n1).
using RangeFn = void (*)(const Problem& p, int64_t n0, int64_t n1);

struct Kernels {
  const char* name;
  RangeFn range;
  // bf16 activations (p.xb) x bf16 or MXFP4 weights (MXFP4 as its exact bf16 dequantization),
  // nullptr when the machine has no bf16 dot product. Its order: block after block, lane j takes
  // the bf16 pair (2j, 2j + 1) with one vdpbf16ps; then the same pairwise lane sum. Also a
  // function of K alone.
  RangeFn range_bf16 = nullptr;
  // Units of 8 rows (kRowUnit) in the range kernel's widest tile, for one x row and for more:
  // ranges made of whole tiles need no narrower remainder tiles.
  int64_t tile_units_one = 1;
  int64_t tile_units_many = 1;
  // bf16 and MXFP4 weights packed as kTiles or unpacked with cols % 32 == 0 (AMX only; nullptr
  // elsewhere, where kTiles weights take the scalar fallback): fp32 activations from p.xt, bf16
  // ones from p.xb. Their order is AMX's (matmul_amx.cc), not the canonical one; it too depends on
  // K alone.
  RangeFn range_tiles = nullptr;
  RangeFn range_tiles_bf16 = nullptr;
};

// nullptr when the instruction set is missing (build or machine).
const Kernels* AmxKernels();
const Kernels* Avx512Kernels();
const Kernels* Avx2Kernels();
const Kernels* ScalarKernels();

// The AVX2 kernels for lane-major packed weights (kernels/cpu/pack.h); n0, n1 multiples of
// kPackRows. The AVX2 range hands such weights here; the AVX-512 range hands weights in either
// AVX2 layout (kLanes, kPairs) to the AVX2 range (the machines that pack them so have AVX2).
void LaneMajorRangeAvx2(const Problem& p, int64_t n0, int64_t n1);

// How far ahead of a stream of weights the kernels touch one line of each 4 KiB page, so that its
// address translation is in the TLB before the stream gets there (matmul_avx512.cc,
// PrefetchPageAhead, has the measurements; the AVX2 kPairs tile takes the same distance).
inline constexpr int64_t kPageAheadBytes = 64 << 10;

// Prefetches spread over the passes of a packed group (AVX-512 Bf16Group::SpreadOver): a group of
// nb blocks of block_lines cache lines, read in `passes` passes (strips of x rows), prefetches the
// lines of a stretch as long as the group, SpreadAheadBytes from its start, block visit v = pass *
// nb + b taking lines [SpreadLine(v), SpreadLine(v + 1)): over the visits in order, every line of
// the stretch once, at most ceil(block_lines / passes) a visit.
constexpr int64_t SpreadLine(int64_t visit, int64_t block_lines, int64_t passes) {
  return visit * block_lines / passes;
}
// Whole groups, at least ahead_bytes.
constexpr int64_t SpreadAheadBytes(int64_t group_bytes, int64_t ahead_bytes) {
  return (ahead_bytes + group_bytes - 1) / group_bytes * group_bytes;
}

// xp[kp] = x[k] in the canonical layout.
void PermuteRow(float* xp, const float* x, int64_t k, int64_t kp);
// xb[kp] = x[k] rounded to bf16 (F32ToBf16), zero-padded: the bf16 path's activations.
void RoundRowToBf16(uint16_t* xb, const float* x, int64_t k, int64_t kp);
// x[k] = hi + mid + lo, each a bf16 (zero-padded to kp): hi is x truncated to bf16, mid the
// remainder truncated, lo what is left (at most eight significant bits: exact for |x| above about
// 2^-110; below, bits under 2^-133 are lost). A non-finite x is all in hi. Written as one row of
// Problem::xt's layout: column c's terms at xt + c / 32 * block_stride + {0, 32, 64} + c % 32
// (row i of m at xt + XtRowOffset(i, m, kp), block_stride = XtBlockStride(m)).
void SplitRowToBf16x3(uint16_t* xt, int64_t block_stride, const float* x, int64_t k, int64_t kp);

// Problem::xt's geometry (uint16 units): panels of up to 32 rows, one 32-row step of the AMX
// kernels; with m <= 32 one panel of m rows, [kp / 32][m][3][32].
constexpr int64_t kXtPanelRows = 32;
inline int64_t XtPanelRows(int64_t m) { return m < kXtPanelRows ? m : kXtPanelRows; }
inline int64_t XtBlockStride(int64_t m) { return 96 * XtPanelRows(m); }
inline int64_t XtPanelStride(int64_t m, int64_t kp) { return 3 * XtPanelRows(m) * kp; }
inline int64_t XtRowOffset(int64_t i, int64_t m, int64_t kp) {
  return i / kXtPanelRows * XtPanelStride(m, kp) + i % kXtPanelRows * 96;
}
inline int64_t XtSize(int64_t m, int64_t kp) {
  return (m + kXtPanelRows - 1) / kXtPanelRows * XtPanelStride(m, kp);
}

// 2^(s-127) for every E8M0 byte (255: NaN, 0: 2^-127).
extern const float* const kE8m0;
// E2M1(c) * 2^(s-127) as bf16, [s][c] for c in 0..31 (c and c + 16 alike, for a vpermw that
// ignores index bit 4): exact (two significant bits), but subnormal for the smallest values at
// scales 0 and 1 and infinite for the largest at 253 and 254; NaN at 255. Built at start-up
// without AVX-512 (matmul_avx512.cc), so that every x86-64 may load the library.
extern const uint16_t (*const kE2m1Bf16ByScale)[32];
// E2M1 code -> value.
extern const float kE2m1[16];

}  // namespace kimi::cpu::matmul_internal
