// MatMul kernels for AMX (Intel's tile matrix unit, BF16): bf16 and MXFP4 weights of whole
// 32-column blocks, packed as kTiles (kernels/cpu/pack.h) or unpacked (made into tiles on the fly,
// the same bits); every other weight through the AVX-512 kernels. MXFP4 enters as its exact bf16
// values (Mxfp4TilesRange, below, has its own order of sums).
//
// One TDPBF16PS multiplies a tile of up to 16 x rows by 32 columns (bf16, natural order) with a
// kTiles block of 16 weight rows (the block transposed by column pairs, as the instruction wants
// its second operand) and adds to a 16 x 16 fp32 tile: about 8x the products per cycle of the
// AVX-512 BF16 dot product, at the same cost whether the x tile holds 1 row or 16 (measured on the
// Xeon host: 4.3 ns an instruction at 1, 4, 8 or 16 rows; one accumulator chain runs at full rate).
//
// Summation order (the AMX order; results depend on K alone, as everywhere, but differ from the
// canonical order of matmul_impl.h): each output is one fp32 accumulator that takes the 32-column
// blocks in turn, each block as one TDPBF16PS. Activations:
//   - bf16 (ActivationScope(kBf16)): x rounded to bf16 (nearest even), one instruction per block;
//   - fp32 (the default): x split exactly into three bf16 terms, x = hi + mid + lo (each the top
//     eight significant bits of what the terms before it left), and the block takes hi, mid, lo in
//     turn: every product of a bf16 weight with a term is exact in fp32, so the result is an fp32
//     dot product of the unrounded x, summed in this order (the "bf16x3" split of oneDNN and
//     cuBLAS; tests hold it to the fp32 tolerance). The unit treats bf16 subnormals as zero: a
//     term below 2^-126 (x below about 2^-110) is dropped.
// A row's result never depends on the other rows of its x tile, so m and the thread split change
// no bit.
// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cache_line.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/side_prefetch.h"
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kimi::cpu::matmul_internal {
namespace {

// Linux lends AMX's 8 KiB of tile data only to processes that ask (arch_prctl); without it the
// first tile instruction faults.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool MachineHasAmx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  // AVX512-VBMI as well (the MXFP4 decode's vpmultishiftqb; every AMX CPU so far has it).
  const bool vbmi = (c >> 1) & 1;
  if (!amx_bf16 || !amx_tile || !vbmi) return false;
  __cpuid_count(1, 0, a, b, c, d);
  if (!((c >> 27) & 1)) return false;  // OSXSAVE: xgetbv may be used
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3) != 3) return false;  // XTILECFG and XTILEDATA enabled by the OS
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace
}  // namespace kimi::cpu::matmul_internal

#pragma GCC push_options
#pragma GCC target( \
    "amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx2,fma,bmi,bmi2")

namespace kimi::cpu::matmul_internal {
namespace {

// GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the configuration (the rest
// of the stores to it may be dropped: LDTILECFG then faults), and its _tile_loadd / _tile_stored
// that they touch no memory. These say what the instructions read and write.
#define KIMI_TILE_CONFIG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(*(cfg)) : "memory")
#define KIMI_TILE_LOAD(t, src, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(src), "r"(int64_t{stride}) : "memory")
#define KIMI_TILE_STORE(t, dst, stride)                                                           \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(dst), "r"(int64_t{stride}) : "memor" \
                                                                                          "y")

// Tiles: accumulators 0, 1 (x rows i0.., weight groups g, g + 1) and 2, 3 (x rows i0 + 16..);
// x tiles 4 (rows i0..) and 5 (i0 + 16..); weight tiles 6 (group g) and 7 (g + 1). Steps of 32 x
// rows (rows0 = rows1 = 16, KIMI_TILES_STEP) load both x tiles into 4 and weights into 5, 6, 7:
// with every tile 16 rows by 64 bytes any register holds either.
void Configure(int rows0, int rows1) {
  TileConfig cfg;
  for (int t : {0, 1, 4}) cfg.rows[t] = static_cast<uint8_t>(rows0);
  for (int t : {2, 3, 5}) cfg.rows[t] = static_cast<uint8_t>(rows1);
  for (int t : {6, 7}) cfg.rows[t] = 16;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = cfg.rows[t] ? 64 : 0;
  KIMI_TILE_CONFIG(&cfg);
}

// Runs OP(T) for accumulator tile t (0..3) with T its number as a literal, which is what the tile
// instructions take.
#define KIMI_ON_ACCUMULATOR(t, OP) \
  switch (t) {                     \
    case 0:                        \
      OP(0);                       \
      break;                       \
    case 1:                        \
      OP(1);                       \
      break;                       \
    case 2:                        \
      OP(2);                       \
      break;                       \
    default:                       \
      OP(3);                       \
      break;                       \
  }

// Accumulator tile t zeroed, stored to dst or loaded from src, `stride` bytes between rows.
inline void ZeroAccumulator(int t) {
#define KIMI_OP(T) _tile_zero(T)
  KIMI_ON_ACCUMULATOR(t, KIMI_OP)
#undef KIMI_OP
}
inline void StoreAccumulator(int t, float* dst, int64_t stride) {
#define KIMI_OP(T) KIMI_TILE_STORE(T, dst, stride)
  KIMI_ON_ACCUMULATOR(t, KIMI_OP)
#undef KIMI_OP
}
inline void LoadAccumulator(int t, const float* src, int64_t stride) {
#define KIMI_OP(T) KIMI_TILE_LOAD(T, src, stride)
  KIMI_ON_ACCUMULATOR(t, KIMI_OP)
#undef KIMI_OP
}

// Rows [0, rows) of accumulator tile t, columns [c0, c1) of its 16 (weight rows g * 16 + c), into
// y: straight from the tile when all 16 are wanted, else through a scratch copy.
inline void StoreTile(int t, float* y, int64_t ldy, int64_t g, int64_t rows, int64_t c0,
                      int64_t c1) {
  float* out = y + g * kTileRows;
  if (c0 == 0 && c1 == kTileRows) {
    StoreAccumulator(t, out, ldy * 4);
    return;
  }
  alignas(64) float tile[16 * 16];
  StoreAccumulator(t, tile, 64);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out + r * ldy + c0, tile + r * 16 + c0, (c1 - c0) * sizeof(float));
  }
}

// Transposes 16 rows of 16 dwords in place (v[i] lane j <- v[j] lane i).
inline void Transpose16(__m512i (&v)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  // b[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3.
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i p = _mm512_shuffle_i32x4(b[c], b[4 + c], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i q = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i r = _mm512_shuffle_i32x4(b[c], b[4 + c], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i s = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], _MM_SHUFFLE(3, 2, 3, 2));
    v[c] = _mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(2, 0, 2, 0));
    v[4 + c] = _mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(3, 1, 3, 1));
    v[8 + c] = _mm512_shuffle_i32x4(r, s, _MM_SHUFFLE(2, 0, 2, 0));
    v[12 + c] = _mm512_shuffle_i32x4(r, s, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Block b of rows [r0, r0 + 16) of a row-major bf16 weight as a kTiles tile (rows past `rows`
// zero): what a packed weight holds there.
inline void TileOfRowMajor(const uint16_t* w, int64_t cols, int64_t rows, int64_t r0, int64_t b,
                           uint16_t* tile) {
  __m512i v[16];
  for (int j = 0; j < 16; ++j) {
    v[j] =
        r0 + j < rows ? _mm512_loadu_si512(w + (r0 + j) * cols + b * 32) : _mm512_setzero_si512();
  }
  Transpose16(v);
  for (int j = 0; j < 16; ++j) _mm512_store_si512(tile + j * 32, v[j]);
}

// How far ahead of the tiles it loads a packed weight's stream is prefetched (each group's own
// stream, two tiles). The hardware prefetcher alone left tile loads waiting on memory: one x row
// through 8 packed 2048 x 7168 matrices (matvec.bf16) read 29.6-30.5 GB/s against a 35-38 GB/s
// streaming read, batch-1 kimi-linear-small 26.2-26.6 GB/s against 32; prefetched 1, 2, 3, 4 or
// 8 KiB ahead: 37.9 / 39.3-40.5 / 39.6 / 37.3-37.5 / 36.0 and 29.4 / 28.0-28.9 / 28.9 / 28.5-28.9
// / 28.0 (kimi-bench --repeats 3, one run each, two for 2 and 4 KiB); prefill.gemm 876 -> 891-918
// GFLOP/s. At 32 x rows farther was not better: the batch-32 lm_head of kimi-linear-small (100512 x
// 1024, --matmul_profile) took 9.6 / 10.0 / 10.5 ms at 2 / 4 / 8 KiB.
constexpr int64_t kPrefetchBytes = 2048;
// With at most kFarPrefetchRows x rows (a product bound by the memory, not the tile unit) the
// stream is also prefetched into L2 (hint T1) kFarPrefetchBytes ahead of the tile loads, as the
// MXFP4 codes are (kMxfp4PrefetchL2Bytes, below, says why). kimi-bench --repeats 3, binaries
// alternated, two runs each: batch-1 kimi-linear-small 0.863-0.864 -> 0.897-0.900 of the read (one
// thread 0.868-0.887 -> 0.901-0.919), k3-mini 0.795-0.830 -> 0.878-0.892 (0.831 -> 0.864-0.896),
// batch-8 kimi-linear-small 0.776-0.791 -> 0.809-0.814, matvec.bf16 level (1.05 -> 1.01-1.05).
// Rounds with the distance and the row limit from the environment: 14 KiB did less than 8 at one
// row; up to 16 rows no better than up to 8; up to 32 rows at 5 or 6 KiB level at batch 32, at 8
// KiB batch-32 k3-mini steps 38-39 ms against 36-37, and its LM head 5.50-5.55 ms at 10 KiB and
// 4.96-5.12 at 18 against 5.10-5.13 without: so wider products keep the near prefetch alone.
// 4 KiB rather than 8 (the twelfth AMX session): kimi-linear-small's experts (1024 x 1024 and
// 1024 x 512, 64 streamed from memory, both threads, a probe) at 1 / 2 / 4 / 8 x rows 0.93-0.94 /
// 0.91 / 0.88-0.89 / 0.83 of a streaming read against 0.87-0.88 / 0.86 / 0.84-0.85 / 0.80; steps
// with the distance switched every ten in one process (median of the pairs' ratios):
// kimi-linear-small batch 1 0.973 / 0.976, batch 8 0.982, batch 32 0.982 / 0.991, batch 64 1.004;
// k3-mini batch 1 1.002, batch 8 0.991, batch 32 0.997. 3 KiB: batch 32 0.987, batch 1 0.971; 6
// KiB: 0.997 / 0.998.
constexpr int64_t kFarPrefetchBytes = 4096, kFarPrefetchRows = 8;
// How far ahead of the tile loads an MXFP4 weight's codes are prefetched: into L2 (hint T1) far
// ahead, then into L1 near. A core has few fill buffers for misses on their way to L1 and more for
// L2, so at one thread's rate from memory prefetches to L1 alone, however far ahead, leave the
// decode waiting. k3-mini's experts at one row, 1000 streamed from memory on both threads (a
// probe): 11.0 us an expert a thread with T0 at 4 KiB (the AVX-512 MXFP4 kernel's distance),
// 10.1-10.2 with T1 at 8 KiB and T0 at 2 KiB (T1 at 4 / 16 KiB with T0 at 1 KiB: 10.4 /
// 10.3-10.7); one thread alone 9.6-10.1 -> 8.8-8.9. In k3-mini steps (--profile_steps with
// --matmul_profile, three runs each, alternated) the experts' thread-ms a step: batch 8
// 11.26-11.44 -> 10.54-10.87, batch 32 18.24-19.18 -> 17.51-18.06.
constexpr int64_t kMxfp4PrefetchL2Bytes = 8192, kMxfp4PrefetchL1Bytes = 2048;
// Lines of the side prefetch a block (a tile product of 48 cycles or more at fp32).
constexpr int kSideLines = 4;

// The activations as rows of bf16 (kTerms 1: p.xb, an x row each; 3: p.xt, row 3 i + t x row i's
// term t): row r's block b of 32 at x + r * row + b * block (uint16 units).
//
// p.xt was [m][3][kp] before: a tile of 16 rows of a term then took lines 6 kp bytes apart (48 KiB
// at K = 512, 12 pages), and its loads held the tile unit back. A probe of the fp32 tile loop (2
// weight and 6 x tiles, 12 products a block pair, weights in L2) took 8.0 ns a product so and 5.5
// with the block-major layout (lines 192 bytes apart; 5.3-5.5 with each tile's 1 KiB contiguous).
// TilesRangeF32 alone, one thread: 512 x 512 at 32 rows (in L2) 582 -> 712 GFLOP/s, the prefill
// shape 512 x 4096 x 1024 483 -> 587; MatMul on both threads 874-895 -> 970-983; kimi-bench
// (alternated) prefill.gemm 892-909 -> 954-1003 GFLOP/s, prefill.512 k3-mini 360-373 -> 345-353
// ms, kimi-linear-small 459-472 -> 445-450, batch-32 k3-mini steps 39.8-40.0 -> 39.0; batch 1 / 8
// and matvec level.
//
// In panels of 32 rows (the thirteenth AMX session): with m > 32 a 32-row step's x tiles of one
// block lay 192 m bytes from the next block's (96 KiB at 512 rows), so a pass over the blocks took
// each tile from L2 out of any stream the prefetchers follow; in a panel they are 6 KiB apart. A
// probe of the prefill loop (one thread, 48 weight groups in L2, 512 x rows): 9.3-9.8 -> 8.0-8.5
// ns a product. MatMul 512 x 4096 x 1024, one thread 8.99-9.27 -> 8.43-8.70 ms, two 4.42-4.66
// -> 4.33-4.43; kimi-bench, binaries alternated, three runs each: prefill.gemm 0.418-0.422 ->
// 0.427-0.439 of oneDNN, prefill.512 kimi-linear-small 478-510 -> 443-487 ms, k3-mini 368-388 ->
// 366-381; batch-64 steps (two runs) kimi-linear-small 128.4 / 122.0 -> 126.3 / 121.7 ms, k3-mini
// 67.7 / 65.7 -> 63.7 / 60.9. Up to 32 rows (decode) the layout is the one before.
struct XRows {
  const uint16_t* x;
  int64_t row, block, panel;  // panel: from row i to row i + 32 (p.xb: 32 rows of kp)
  // Row i's first block; the rows after it, kTerms * row apart, up to the end of its panel.
  const uint16_t* Row(int64_t i, int kTerms) const {
    return x + i / kXtPanelRows * panel + i % kXtPanelRows * kTerms * row;
  }
};
template <int kTerms>
XRows XRowsOf(const Problem& p) {
  if constexpr (kTerms == 1) {
    return {p.xb, p.kp, 32, kXtPanelRows * p.kp};
  } else {
    return {p.xt, 32, XtBlockStride(p.m), XtPanelStride(p.m, p.kp)};
  }
}

// One step of TilesRange (reading its kTerms and locals tile0, tile1, two, rows1, x0, x1, xr, b,
// x_stride; writing accumulators 0-3 and tile registers 4, X1, WA, WB): the weight tiles of groups
// g and g + 1 loaded into registers WA and WB, x rows 0..15 into register 4 and, with rows1, x rows
// 16.. into X1; every accumulator takes its block's terms in turn. The general step is (6, 7, 5).
// Steps of 32 x rows take (5, 6, 4), (7, 5, 4), (6, 7, 4) in turn: the same products in the same
// order (the same bits). A tile load waits for the products still reading its register (the probes
// behave as if tile registers were not renamed), so the general step's reload of registers 6 and 7
// could not start until the previous step's twelve products (fp32, 32 rows) were done, and then
// the unit waited for the load: the weight's memory traffic and the products took turns. With
// registers 5, 6, 7 in turn one of a step's two loads goes to a register the previous step did not
// read. Register 4's x loads wait likewise for the two products before each, but x (1 KiB a tile)
// comes from L1 or L2, not memory. One register for both x tiles needs both full (a tile's rows
// are part of the configuration). A probe of the loop alone (one thread, 12 products and 2 KiB of
// weights a step, x laid out as here, K = 512): weights from memory 270-279 -> 210-226 ns a step,
// from L3 125-135 -> 108-117, from L2 level. In the engine (benchmarks/README.md, sixth AMX
// session): batch-64 LM heads 9-10% faster, kimi-linear-small batch-64 steps -4%; batch 32 and
// prefill level.
#define KIMI_TILES_STEP(WA, WB, X1)                                   \
  do {                                                                \
    KIMI_TILE_LOAD(WA, tile0, 64);                                    \
    if (two) KIMI_TILE_LOAD(WB, tile1, 64);                           \
    for (int t = 0; t < kTerms; ++t) {                                \
      KIMI_TILE_LOAD(4, x0 + t * xr.row + b * xr.block, x_stride);    \
      _tile_dpbf16ps(0, 4, WA);                                       \
      if (two) _tile_dpbf16ps(1, 4, WB);                              \
      if (rows1) {                                                    \
        KIMI_TILE_LOAD(X1, x1 + t * xr.row + b * xr.block, x_stride); \
        _tile_dpbf16ps(2, X1, WA);                                    \
        if (two) _tile_dpbf16ps(3, X1, WB);                           \
      }                                                               \
    }                                                                 \
  } while (false)

// y[i, n] for every i < m and n in [n0, n1) (multiples of 8, or n1 = rows), x in kTerms bf16
// terms (1: p.xb; 3: p.xt, each row's hi, mid, lo). Groups straddling n0 or n1 are computed whole
// and stored in part. An unpacked weight's tiles are transposed from its rows as they are needed
// (kPacked false: a memory-mapped checkpoint, a weight whose rows are not whole groups; again for
// every 32 x rows, which costs a prefill of such a weight), so its results are the packed weight's,
// bit for bit.
template <int kTerms, bool kPacked>
void TilesRange(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  const auto* data = static_cast<const uint16_t*>(w.data);
  const int64_t kp = p.kp, nb = kp / 32, group = kTileRows * kp;  // uint16 units per group
  alignas(64) uint16_t transposed[2][512];
  // An x tile: one term of 16 x rows, kTerms rows of XRows apart.
  const XRows xr = XRowsOf<kTerms>(p);
  const int64_t x_stride = kTerms * xr.row * 2;
  // More than one pair of x tiles re-reads the weight once a pair: in chunks of tiles, each read
  // from memory once and then from cache by every pair. Without the chunks 64 rows through a
  // 100512 x 1024 lm_head (200 MB, packed) streamed it twice from memory: 21.6-21.8 -> 18.3-18.4
  // ms with fp32 activations, 16.1-16.2 -> 11.3-11.7 ms with bf16 ones (a standalone loop over
  // MatMul, best of 5, two runs each, alternated); whole steps (batch 64) were level within the
  // host's spread at the time. Prefill (512 x 4096 x 1024, a weight in L3) was level too.
  //
  // Every chunk in turn reads all of x (of a slice, below), so a chunk is half of those x bytes, at
  // least 512 KiB (L2 holds 2 MiB a core on the Xeon host) and at most 4 MiB. With 512 KiB always,
  // 512 rows of K = 7168 (22 MB of x in three terms) re-read x from L3 for every two weight groups:
  // one thread, a 2048 x 7168 weight, 244 GFLOP/s against 317 with chunks of half of all of x
  // (4 MiB; 322 at 8, 284 at 2); at K = 2048 510 against 567; at K = 1024 (3 MB of x) 553 with 512
  // KiB, 568 at 2 MiB, 544 at 4.
  //
  // Wider rows go in slices of kSliceBlocks blocks (with more than one pass of x rows): a chunk's
  // tiles of one slice stay in cache for every pass (in L2 up to about 680 x rows with fp32
  // activations), and x is read once a chunk; each accumulator is kept in `partial` between slices
  // (exact: fp32 stored and loaded as it is), so the order of every output's sums is unchanged,
  // the blocks in turn. `partial` takes 1 KiB for every 16 x rows and group of a chunk: at most 8
  // KiB an x row (1.5 MiB a thread at the default 512-token prefill chunk). One thread, 2048 x
  // 7168: 512 rows 326 -> 600 GFLOP/s, 128 rows 350 -> 586, 64 rows 295 -> 570, bf16 activations
  // 801 -> 1143; MatMul on both threads 605-615 -> 886-914 (bf16 1603 -> 2055); K = 1024 and 2048
  // level.
  constexpr int64_t kSliceBlocks = 32;
  const int64_t slice = p.m > 32 && nb > kSliceBlocks ? kSliceBlocks : nb;
  const int64_t first_group = n0 / kTileRows, end_group = (n1 + kTileRows - 1) / kTileRows;
  const int64_t chunk_bytes =
      std::clamp<int64_t>(p.m * kTerms * slice * 32, int64_t{512} << 10, int64_t{4} << 20);
  const int64_t chunk = p.m <= 32 ? end_group - first_group
                                  : std::max<int64_t>(2, chunk_bytes / (slice * 1024) / 2 * 2);
  // Accumulator tiles between slices: [x row tile][group of the chunk][16 x 16].
  const int64_t kept_groups = std::min(chunk, end_group - first_group);
  thread_local std::vector<float> partial_buffer;
  float* const partial =
      slice < nb ? CacheLineAligned(partial_buffer, (p.m + 15) / 16 * kept_groups * 256) : nullptr;
  int configured = -1;
  // The side prefetch (side_prefetch.h), a few lines a block while there is some, as AVX-512's
  // group loops take it.
  bool side_on = SidePrefetchActive();
  SidePiece side;
  const bool far = p.m <= kFarPrefetchRows;
  int64_t turn = 0;  // steps of 32 x rows so far: which weight registers take the next tiles
  for (int64_t g0 = first_group; g0 < end_group; g0 += chunk) {
    const int64_t g1 = std::min(end_group, g0 + chunk);
    for (int64_t b0 = 0; b0 < nb; b0 += slice) {
      const int64_t b1 = std::min(nb, b0 + slice);
      for (int64_t i0 = 0; i0 < p.m; i0 += 32) {
        const int rows0 = static_cast<int>(std::min<int64_t>(p.m - i0, 16));
        const int rows1 = static_cast<int>(std::clamp<int64_t>(p.m - i0 - 16, 0, 16));
        if (configured != rows0 * 32 + rows1) {
          Configure(rows0, rows1);
          configured = rows0 * 32 + rows1;
        }
        const uint16_t* x0 = xr.Row(i0, kTerms);  // i0 % 32 == 0: x1 in the same panel
        const uint16_t* x1 = x0 + 16 * kTerms * xr.row;
        float* y0 = p.y + i0 * p.ldy;
        float* y1 = y0 + 16 * p.ldy;
        for (int64_t g = g0; g < g1; g += 2) {
          const bool two = g + 1 < g1;
          if (side_on && side.p >= side.end) {
            side = ClaimSidePiece();
            side_on = side.p < side.end;  // none left: stop asking
          }
          // Accumulator t's tile in `partial`: x row tile i0 / 16 + t / 2, group g + t % 2.
          const auto kept = [&](int t) {
            return partial + ((i0 / 16 + t / 2) * kept_groups + (g - g0) + t % 2) * 256;
          };
          // The accumulators in use (tiles 2 and 3 are not configured without rows1, and may not
          // be named then).
          const auto live = [&](int t) { return (two || t % 2 == 0) && (rows1 || t < 2); };
          for (int t = 0; t < 4; ++t) {
            if (!live(t)) continue;
            if (b0 == 0) {
              ZeroAccumulator(t);
            } else {
              LoadAccumulator(t, kept(t), 64);
            }
          }
          const uint16_t* w0 = data + g * group;
          // Near the end of a group the addresses ahead run past it: the first stream's into the
          // second group (read already), the second's into the next pair's first, and the next
          // pair's second group starts unprefetched. With at most 32 x rows (the weight read once,
          // pair after pair) each stream's go on into its own group of the next pair instead (one
          // group skipped: exact while the distance ahead ends within the next group, so for the
          // far prefetch groups of 4 KiB or more, K >= 128; with shorter groups those addresses
          // land one group short of their own, the next pair's second group and the one after,
          // which measured better than the exact place: batch-1 kimi-linear-small 0.925-0.946
          // against 0.917-0.922 of the read, four runs each).
          // kimi-bench, binaries alternated, three runs each: batch-1 kimi-linear-small
          // 0.888-0.910 -> 0.944-0.951 of the read (one thread 0.908-0.914 -> 0.962-0.972), batch
          // 8 50.8-50.9 -> 49.7-49.8 ms, batch 32 84.3-84.5 -> 82.1-83.5 ms; k3-mini within its
          // spread. Not with more rows, where a chunk of the weight is read again from cache for
          // each 32 x rows: prefill.gemm 958-1036 GFLOP/s with it, 992-1082 without.
          const bool wrap = p.m <= 32 && g + 2 < g1;
          const auto ahead_of = [&](int64_t block, int64_t bytes) {  // from its tile, in bytes
            return wrap && block * 1024 + bytes >= group * 2 ? bytes + group * 2 : bytes;
          };
          for (int64_t b = b0; b < b1; ++b) {
            for (int line = 0; line < kSideLines && side.p < side.end; ++line, side.p += 64) {
              _mm_prefetch(side.p, _MM_HINT_T1);
            }
            const uint16_t* tile0 = w0 + b * 512;
            const uint16_t* tile1 = tile0 + group;
            if constexpr (kPacked) {
              const char* ahead =
                  reinterpret_cast<const char*>(tile0) + ahead_of(b, kPrefetchBytes);
              const char* far_ahead =
                  reinterpret_cast<const char*>(tile0) + ahead_of(b, kFarPrefetchBytes);
              for (int line = 0; line < 1024; line += 64) {
                _mm_prefetch(ahead + line, _MM_HINT_T0);
                if (two) _mm_prefetch(ahead + group * 2 + line, _MM_HINT_T0);
                if (far) {
                  _mm_prefetch(far_ahead + line, _MM_HINT_T1);
                  if (two) _mm_prefetch(far_ahead + group * 2 + line, _MM_HINT_T1);
                }
              }
            } else {
              TileOfRowMajor(data, w.cols, w.rows, g * kTileRows, b, transposed[0]);
              if (two) TileOfRowMajor(data, w.cols, w.rows, (g + 1) * kTileRows, b, transposed[1]);
              tile0 = transposed[0];
              tile1 = transposed[1];
            }
            if (rows1 == kTileRows) {
              switch (turn++ % 3) {
                case 0:
                  KIMI_TILES_STEP(5, 6, 4);
                  break;
                case 1:
                  KIMI_TILES_STEP(7, 5, 4);
                  break;
                default:
                  KIMI_TILES_STEP(6, 7, 4);
                  break;
              }
            } else {
              KIMI_TILES_STEP(6, 7, 5);
            }
          }
          if (b1 < nb) {  // more slices to come
            for (int t = 0; t < 4; ++t) {
              if (live(t)) StoreAccumulator(t, kept(t), 64);
            }
            continue;
          }
          for (int64_t h = 0; h < (two ? 2 : 1); ++h) {
            const int64_t first = (g + h) * kTileRows;
            const int64_t c0 = n0 > first ? n0 - first : 0;
            const int64_t c1 = n1 < first + kTileRows ? n1 - first : kTileRows;
            StoreTile(static_cast<int>(h), y0, p.ldy, g + h, rows0, c0, c1);
            if (rows1) StoreTile(static_cast<int>(2 + h), y1, p.ldy, g + h, rows1, c0, c1);
          }
        }
      }
    }
  }
  // Back to the initial state, so a context switch need not save the 8 KiB of tile data.
  _tile_release();
}
#undef KIMI_TILES_STEP

// --- MXFP4 weights packed as kTiles ---
//
// A block of a group's 16 rows becomes one bf16 tile, decoded with vector instructions a few steps
// ahead of the tile loads that read it (a ring of buffers, so a load never waits on the stores that
// wrote its tile): each 64-byte chunk holds four tile rows' codes (TilesCodeNibble), a word's low
// bits indexing a table of the E2M1 values (vpermw), and each nonzero value takes its row's
// s - 127 on its bf16 exponent: the exact product E2M1 x 2^(s - 127) (kTilesMinScale). With fp32
// activations the three terms of each x row are three rows of the x tile (five x rows a tile), each
// accumulating its own sums block after block, and are added at the end, (hi + mid) + lo: one
// instruction a block where the bf16 kernel's order takes three. The decode is the cost (the tile
// unit idles half the time at one x row), so more x rows cost almost nothing. One thread, k3-mini's
// expert shape 512 x 256 in L2, against the AVX-512 kernel: 1.00-1.07x the time at one x row, 0.80
// at two, 0.62 at three, 0.45 at five (4.4 / 4.6 / 4.9 / 6.0 us). Decoding into a tile a step ahead
// of its load instead of just before it took one x row from 1.7x to 1.1x; a C tile a block, scaled
// as fp32 when stored (no exponent arithmetic), 1.1-1.2x (each store waits for its product). In the
// engine, alternated with the binary before (kimi-bench, two runs each): k3-mini batch 32 / 64
// steps 44.3-44.6 / 76.1-81.9 ms -> 39.4-39.7 / 65.5-66.2, batch 1 23.8-23.9 -> 25.4-25.9 GB/s,
// batch 8 level (19.5-19.9 ms), prefill.512 463-474 -> 358-379 ms; matvec.mxfp4 (one 34 MB
// matrix, one row, both threads) 30.0-33.0 -> 25.9-27.3 GB/s: on a stream that long the AVX-512
// kernel reads faster than this one decodes. An expert's 7168 x 2048 or 2048 x 7168 (16 of each,
// cycled) took 0.83-0.86x the AVX-512 kernel's time, one row, both threads.
//
// Summation order: output (i, n) is, for each term, one fp32 accumulator taking the blocks in turn
// (each a TDPBF16PS over the block's 16 pairs), the terms then added as above. It depends on K
// alone: x rows, thread split and ranges change no bit.

// Block (g, b)'s tile: 16 rows of 16 pairs, from its 256 code bytes and 16 scales. `table` holds
// the codes at scale kTilesMaxScale with both zeros +0 (Mxfp4DecodeTable): a word's value there
// less (kTilesMaxScale - s) << 7, saturating at zero, is the code at scale s. A nonzero code's
// magnitude there is at least 2^-1 x 2^125 (exponent field 251) and the subtrahend at most 250 <<
// 7, so it never saturates and never borrows from the sign; a zero stays +0, whatever the scale (a
// block of zeros may carry any). The tiles differ from the exact values in -0 alone (as +0), which
// changes no sum: an accumulator starts at +0 and +0 + -0 is +0.
//
// Ports (Sapphire Rapids, 512-bit vectors): vpermw is two uops, one on port 0 and one on port 5;
// shifts and saturating subtractions run on port 0 alone, vpmultishiftqb, vptestmw on port 5. A
// row of the tile took vpermw, a shift (three rows in four), vptestmw and a masked add before
// (4.75 uops, ports 0 and 5 busy 2.4 cycles); a vpmultishiftqb in place of the shift (each index
// byte taken from its nibble's bit offset) and one saturating subtraction take 3.75 (2 cycles on
// port 0). A probe decoding 256 tiles in L1, one thread: 9.5-10.2 against 11.2-12.6 ns a tile;
// k3-mini's expert (512 x 256 and 256 x 256) at one x row with its tile products, in L2 5.3-5.5
// against 6.1-6.3 us, streamed from memory 8.5-8.8 against 8.5-9.2. k3-mini steps, the two decodes
// alternated every ten steps in one process (median of the pairs' ratios): batch 1 0.982, batch 8
// 0.977 and 0.984, batch 32 0.994, batch 64 0.993 and 1.011.
inline void DecodeMxfp4Tile(const uint8_t* codes, const uint8_t* scales, uint16_t* tile,
                            __m512i table) {
  // Words 2j and 2j + 1 (row j's pair) of every tile row: (kTilesMaxScale - s_j) << 7.
  const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
  const __m512i down =
      _mm512_sub_epi16(_mm512_set1_epi16(kTilesMaxScale << 7),
                       _mm512_or_si512(_mm512_slli_epi32(s, 7), _mm512_slli_epi32(s, 23)));
  // Tile row 4q + t's index bytes: byte 2i of each qword from bit 16i + 4t of the chunk's qword
  // (vpermw reads a word's low five bits; the table repeats, so bit 4 is free).
  const __m512i from_nibble[3] = {_mm512_set1_epi64(0x0034002400140004),
                                  _mm512_set1_epi64(0x0038002800180008),
                                  _mm512_set1_epi64(0x003c002c001c000c)};
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512i chunk = _mm512_loadu_si512(codes + q * 64);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const __m512i index =
          t == 0 ? chunk : _mm512_multishift_epi64_epi8(from_nibble[t - 1], chunk);
      const __m512i v = _mm512_permutexvar_epi16(index, table);
      _mm512_store_si512(tile + (4 * q + t) * 32, _mm512_subs_epu16(v, down));
    }
  }
}

// DecodeMxfp4Tile's table: the 16 codes at scale kTilesMaxScale, twice, code 8 (-0) as +0.
inline __m512i Mxfp4DecodeTable() {
  return _mm512_maskz_mov_epi16(~__mmask32{0x01010101},
                                _mm512_load_si512(kE2m1Bf16ByScale[kTilesMaxScale]));
}

// Block b of rows [r0, r0 + 16) of a row-major MXFP4 weight (rows past `rows` zero) as the tile a
// packed weight decodes to (scales in [kTilesMinScale, kTilesMaxScale]; any other scale as its
// value, though the tile unit reads a bf16 subnormal as zero): each row's codes
// decoded with its scale's table into its 16 pairs (word 2J + q = element 2J + q: one dword a
// pair), then the 16 rows transposed so that tile row J holds every row's pair J.
inline void Mxfp4TileOfRowMajor(const uint8_t* codes, const uint8_t* scales, int64_t cols,
                                int64_t rows, int64_t r0, int64_t b, uint16_t* tile) {
  __m512i v[16];
  for (int j = 0; j < 16; ++j) {
    const int64_t r = r0 + j;
    if (r >= rows) {
      v[j] = _mm512_setzero_si512();
      continue;
    }
    const __m512i c = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + r * (cols / 2) + b * 16)));
    v[j] =
        _mm512_permutexvar_epi16(_mm512_or_si512(c, _mm512_slli_epi32(c, 12)),
                                 _mm512_load_si512(kE2m1Bf16ByScale[scales[r * (cols / 32) + b]]));
  }
  Transpose16(v);
  for (int j = 0; j < 16; ++j) _mm512_store_si512(tile + j * 32, v[j]);
}

// The x tiles of one step against weight tile B (6 or 7; the tile instructions take literal tile
// numbers): x row tiles 0 .. nt-1 (all but the last full, loaded into tile 4; the last into tile
// 5), their sums into accumulators 0 .. nt-1.
#define KIMI_MXFP4_PRODUCTS(B, a, stride, tile_elems, nt)       \
  do {                                                          \
    if ((nt) > 1) {                                             \
      KIMI_TILE_LOAD(4, (a), (stride));                         \
      _tile_dpbf16ps(0, 4, B);                                  \
    }                                                           \
    if ((nt) > 2) {                                             \
      KIMI_TILE_LOAD(4, (a) + (tile_elems), (stride));          \
      _tile_dpbf16ps(1, 4, B);                                  \
    }                                                           \
    if ((nt) > 3) {                                             \
      KIMI_TILE_LOAD(4, (a) + 2 * (tile_elems), (stride));      \
      _tile_dpbf16ps(2, 4, B);                                  \
    }                                                           \
    KIMI_TILE_LOAD(5, (a) + ((nt)-1) * (tile_elems), (stride)); \
    if ((nt) == 1) _tile_dpbf16ps(0, 5, B);                     \
    if ((nt) == 2) _tile_dpbf16ps(1, 5, B);                     \
    if ((nt) == 3) _tile_dpbf16ps(2, 5, B);                     \
    if ((nt) == 4) _tile_dpbf16ps(3, 5, B);                     \
  } while (false)

// y[i, n] for every i < m and n in [n0, n1) of an MXFP4 weight, packed as kTiles or not (its tiles
// then made from its rows, Mxfp4TileOfRowMajor: the same bits); kTerms as TilesRange's. Groups
// straddling n0 or n1 are computed whole and stored in part.
template <int kTerms, bool kPacked>
void Mxfp4TilesRange(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const int64_t kp = p.kp, nb = kp / 32;
  const XRows xr = XRowsOf<kTerms>(p);              // an x tile: kTerms rows of XRows an x row
  const int64_t x_stride = xr.row * 2;              // bytes between x tile rows
  constexpr int64_t kRowsPerTile = 16 / kTerms;     // x rows an x tile holds
  constexpr int64_t kChunkRows = 4 * kRowsPerTile;  // x rows at a time: four accumulators
  // Steps (group, block) decode this many ahead of their tile loads, into a ring of kRing tiles.
  constexpr int64_t kAhead = 2, kRing = 4;
  alignas(64) uint16_t ring[kRing][512];
  alignas(64) float sums[16 * 16];
  const __m512i table = Mxfp4DecodeTable();
  const int64_t first_group = n0 / kTileRows, end_group = (n1 + kTileRows - 1) / kTileRows;
  // More x rows than one chunk read each weight chunk once per chunk of x rows, from cache after
  // the first, and all of x once per weight chunk; a weight chunk is half of x's bytes of codes,
  // 512 KiB to 4 MiB, as TilesRange's (512 KiB always: one thread, 2048 x 7168, 64 / 256 rows 6.19
  // / 22.7 ms against 5.25 / 17.7 now; K = 1024 and k3-mini's experts level).
  const int64_t group_chunk =
      p.m <= kChunkRows
          ? end_group - first_group
          : std::max<int64_t>(
                1, std::clamp<int64_t>(p.m * kTerms * kp, int64_t{512} << 10, int64_t{4} << 20) /
                       (nb * 256));
  int configured = -1;
  for (int64_t g0 = first_group; g0 < end_group; g0 += group_chunk) {
    const int64_t g1 = std::min(end_group, g0 + group_chunk);
    for (int64_t i0 = 0, rows = 0; i0 < p.m; i0 += rows) {
      // A chunk within one of p.xt's panels (its x tiles are rows kTerms * xr.row apart).
      rows = std::min(kChunkRows, p.m - i0);
      if constexpr (kTerms == 3) rows = std::min(rows, kXtPanelRows - i0 % kXtPanelRows);
      const int nt = static_cast<int>((rows + kRowsPerTile - 1) / kRowsPerTile);
      const int64_t last_rows = rows - (nt - 1) * kRowsPerTile;
      if (configured != rows) {
        TileConfig cfg;
        for (int t = 0; t < nt; ++t) {
          cfg.rows[t] = static_cast<uint8_t>(kTerms * (t + 1 < nt ? kRowsPerTile : last_rows));
        }
        if (nt > 1) cfg.rows[4] = static_cast<uint8_t>(kTerms * kRowsPerTile);
        cfg.rows[5] = static_cast<uint8_t>(kTerms * last_rows);
        cfg.rows[6] = cfg.rows[7] = 16;
        for (int t = 0; t < 8; ++t) cfg.colsb[t] = cfg.rows[t] ? 64 : 0;
        KIMI_TILE_CONFIG(&cfg);
        configured = static_cast<int>(rows);
      }
      const uint16_t* xa = xr.Row(i0, kTerms);
      const int64_t tile_elems = kRowsPerTile * kTerms * xr.row;
      const int64_t steps = (g1 - g0) * nb;
      const auto decode = [&](int64_t s) __attribute__((always_inline)) {
        const int64_t unit = g0 * nb + s;  // (group, block) in the weight's order
        if constexpr (kPacked) {
          DecodeMxfp4Tile(codes + unit * 256, w.scales + unit * 16, ring[s % kRing], table);
        } else {
          Mxfp4TileOfRowMajor(codes, w.scales, w.cols, w.rows, unit / nb * kTileRows, unit % nb,
                              ring[s % kRing]);
        }
      };
      for (int64_t s = 0; s < std::min(kAhead, steps); ++s) decode(s);
      int64_t s = 0;
      for (int64_t g = g0; g < g1; ++g) {
        for (int t = 0; t < nt; ++t) ZeroAccumulator(t);
        for (int64_t b = 0; b < nb; ++b, ++s) {
          if (s + kAhead < steps) {
            if constexpr (kPacked) {
              const char* ahead = reinterpret_cast<const char*>(codes + (g0 * nb + s) * 256);
              for (int line = 0; line < 256; line += 64) {
                _mm_prefetch(ahead + kMxfp4PrefetchL2Bytes + line, _MM_HINT_T1);
                _mm_prefetch(ahead + kMxfp4PrefetchL1Bytes + line, _MM_HINT_T0);
              }
            }
            decode(s + kAhead);
          }
          if (s % 2 == 0) {
            KIMI_TILE_LOAD(6, ring[s % kRing], 64);
            KIMI_MXFP4_PRODUCTS(6, xa + b * xr.block, x_stride, tile_elems, nt);
          } else {
            KIMI_TILE_LOAD(7, ring[s % kRing], 64);
            KIMI_MXFP4_PRODUCTS(7, xa + b * xr.block, x_stride, tile_elems, nt);
          }
        }
        const int64_t first = g * kTileRows;
        const int64_t c0 = n0 > first ? n0 - first : 0;
        const int64_t c1 = n1 < first + kTileRows ? n1 - first : kTileRows;
        for (int t = 0; t < nt; ++t) {
          StoreAccumulator(t, sums, 64);
          const int64_t tile_rows = t + 1 < nt ? kRowsPerTile : last_rows;
          for (int64_t i = 0; i < tile_rows; ++i) {
            const float* term = sums + i * kTerms * 16;
            float* out = p.y + (i0 + t * kRowsPerTile + i) * p.ldy + first;
            for (int64_t c = c0; c < c1; ++c) {
              out[c] = kTerms == 1 ? term[c] : (term[c] + term[16 + c]) + term[32 + c];
            }
          }
        }
      }
    }
  }
  _tile_release();
}

void TilesRangeF32(const Problem& p, int64_t n0, int64_t n1) {
  if (p.w->format == WeightFormat::kMxfp4) {
    return p.w->packed ? Mxfp4TilesRange<3, true>(p, n0, n1) : Mxfp4TilesRange<3, false>(p, n0, n1);
  }
  p.w->packed ? TilesRange<3, true>(p, n0, n1) : TilesRange<3, false>(p, n0, n1);
}
void TilesRangeBf16(const Problem& p, int64_t n0, int64_t n1) {
  if (p.w->format == WeightFormat::kMxfp4) {
    return p.w->packed ? Mxfp4TilesRange<1, true>(p, n0, n1) : Mxfp4TilesRange<1, false>(p, n0, n1);
  }
  p.w->packed ? TilesRange<1, true>(p, n0, n1) : TilesRange<1, false>(p, n0, n1);
}

}  // namespace
}  // namespace kimi::cpu::matmul_internal

#pragma GCC pop_options

namespace kimi::cpu::matmul_internal {

const Kernels* AmxKernels() {
  static const Kernels* const kernels = []() -> const Kernels* {
    const Kernels* avx512 = Avx512Kernels();
    // The AVX-512 kernels with BF16 (every other weight's, and the x conversions'), then the unit.
    if (!avx512 || !avx512->range_bf16 || !MachineHasAmx()) return nullptr;
    static Kernels k = *avx512;
    k.name = "amx";
    k.range_tiles = &TilesRangeF32;
    k.range_tiles_bf16 = &TilesRangeBf16;
    // Two units (16 rows, one weight group) per tile: ranges of whole groups.
    k.tile_units_one = k.tile_units_many = 2;
    return &k;
  }();
  return kernels;
}

}  // namespace kimi::cpu::matmul_internal
