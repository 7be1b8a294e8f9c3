#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string_view>
#include <vector>

#include "kernels/cpu/cache_line.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/next_product.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kimi::cpu {
namespace matmul_internal {
namespace {

constexpr float E8m0Value(int s) {
  // 2^(s-127); s = 255 is NaN in the OCP spec, s = 0 is 2^-127 (a subnormal in fp32).
  if (s == 255) return __builtin_nanf("");
  float f = 1.0f;
  for (int i = s; i < 127; ++i) f *= 0.5f;
  for (int i = 127; i < s; ++i) f *= 2.0f;
  return f;
}

struct E8m0Table {
  float v[256];
  constexpr E8m0Table() : v() {
    for (int i = 0; i < 256; ++i) v[i] = E8m0Value(i);
  }
};
constexpr E8m0Table kE8m0Table;

// Offset of the unit (a bf16 pair, an MXFP4 code byte or scale) holding element i of row r in a
// packed weight (kernels/cpu/pack.h), in units; `per_block` units per 32 columns of a row. Not for
// kPairs codes (their nibbles move between bytes: PairsCodeByte); scales are in block order in
// every layout.
int64_t PackedUnit(const Weight& w, int64_t r, int64_t i, int64_t per_block) {
  const int64_t G = PackGroupRows(w.layout);
  const int64_t g = r / G, j = r % G, b = i / 32, u = (i % 32) * per_block / 32;
  const int64_t nb = w.cols / 32, group = g * G * nb * per_block;
  if (w.layout == PackLayout::kLanes) return group + ((u * nb + b) * G + j);
  if (w.layout == PackLayout::kTiles) return group + ((b * per_block + u) * G + j);
  return group + (b * G + j) * per_block + u;
}

// Element i of row r as fp32 (0 beyond the row), for the scalar fallback.
float Element(const Weight& w, int64_t r, int64_t i) {
  const int64_t k = w.cols;
  if (i >= k) return 0.0f;
  if (w.packed && w.format == WeightFormat::kBF16) {
    const uint16_t* pair = static_cast<const uint16_t*>(w.data) + 2 * PackedUnit(w, r, i, 16);
    return Bf16ToF32(pair[i & 1]);
  }
  if (w.packed && w.format == WeightFormat::kMxfp4) {
    const float scale = kE8m0[w.scales[PackedUnit(w, r, i, 1)]];  // one scale per block
    const auto* codes = static_cast<const uint8_t*>(w.data);
    if (w.layout == PackLayout::kPairs) {
      const int64_t group = (r / kPackRows) * kPackRows * (k / 2), j = r % kPackRows;
      const uint8_t byte = codes[group + PairsCodeByte(j, i / 32, i % 32)];
      return kE2m1[j % 2 ? byte >> 4 : byte & 0xf] * scale;
    }
    if (w.layout == PackLayout::kTiles) {
      const int64_t group = (r / kTileRows) * kTileRows * (k / 2);
      const CodeNibble at = TilesCodeNibble(r % kTileRows, i / 32, i % 32);
      return kE2m1[(codes[group + at.byte] >> at.shift) & 0xf] * scale;
    }
    const uint8_t byte = codes[PackedUnit(w, r, i, 16)];
    return kE2m1[(i & 1) ? byte >> 4 : byte & 0xf] * scale;
  }
  switch (w.format) {
    case WeightFormat::kF32:
      return static_cast<const float*>(w.data)[r * k + i];
    case WeightFormat::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(w.data)[r * k + i]);
    case WeightFormat::kF16:
      return F16ToF32(static_cast<const uint16_t*>(w.data)[r * k + i]);
    case WeightFormat::kMxfp4: {
      const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (k / 2) + i / 2];
      const float scale = kE8m0[w.scales[r * (k / 32) + i / 32]];
      return kE2m1[(i & 1) ? byte >> 4 : byte & 0xf] * scale;
    }
  }
  return 0.0f;
}

void ScalarRange(const Problem& p, int64_t n0, int64_t n1) {
  const Weight& w = *p.w;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t i = 0; i < p.m; ++i) {
      const float* xp = p.xp + i * p.kp;
      float acc[16] = {};
      for (int64_t b = 0; b < p.kp; b += 32) {
        for (int j = 0; j < 16; ++j) {
          acc[j] = acc[j] + xp[b + j] * Element(w, n, b + 2 * j);
          acc[j] = acc[j] + xp[b + 16 + j] * Element(w, n, b + 2 * j + 1);
        }
      }
      for (int width = 8; width > 0; width /= 2) {
        for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
      }
      p.y[i * p.ldy + n] = acc[0];
    }
  }
}

}  // namespace

const float* const kE8m0 = kE8m0Table.v;

const float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void PermuteRow(float* __restrict xp, const float* __restrict x, int64_t k, int64_t kp) {
  int64_t b = 0;
  // Whole blocks first: without the bounds tests the compiler vectorises the de-interleave (the
  // scalar loop was 2% of the calling thread's time in a batch-8 step on k3-mini, where it runs
  // while the other threads wait).
  for (; b + 32 <= k; b += 32) {
    for (int j = 0; j < 16; ++j) {
      xp[b + j] = x[b + 2 * j];
      xp[b + 16 + j] = x[b + 2 * j + 1];
    }
  }
  for (; b < kp; b += 32) {
    for (int j = 0; j < 16; ++j) {
      const int64_t e = b + 2 * j, o = e + 1;
      xp[b + j] = e < k ? x[e] : 0.0f;
      xp[b + 16 + j] = o < k ? x[o] : 0.0f;
    }
  }
}

// xb[kp] = x[k] rounded to bf16, zero-padded, vectorised in each clone: the scalar loop was 7% of
// a batch-64 k3-mini step with bf16 activations, run while the other threads wait.
KIMI_CLONES void RoundRowToBf16(uint16_t* __restrict xb, const float* __restrict x, int64_t k,
                                int64_t kp) {
  for (int64_t c = 0; c < k; ++c) xb[c] = F32ToBf16(x[c]);
  for (int64_t c = k; c < kp; ++c) xb[c] = 0;
}

// Columns [0, n) of x split into the three terms (SplitRowToBf16x3). Written with bit operations
// and no branches so that every clone it is inlined into vectorises it. Truncation (not rounding)
// makes each term the top eight significant bits of what is left, so three are exact.
__attribute__((always_inline)) inline void SplitToBf16x3(uint16_t* __restrict hi,
                                                         uint16_t* __restrict mid,
                                                         uint16_t* __restrict lo,
                                                         const float* __restrict x, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    uint32_t bits;
    std::memcpy(&bits, &x[c], 4);
    // Inf and NaN stay whole in hi (their remainders would be NaN).
    const uint32_t finite = (bits & 0x7f800000u) == 0x7f800000u ? 0u : ~0u;
    // A NaN whose payload is all in the low half would truncate to an infinity: keep it quiet.
    const uint32_t nan = (bits & 0x7fffffffu) > 0x7f800000u ? 0x00400000u : 0u;
    const uint32_t h = (bits & 0xffff0000u) | nan;
    float hf, r1, mf;
    std::memcpy(&hf, &h, 4);
    r1 = x[c] - hf;
    uint32_t r1_bits;
    std::memcpy(&r1_bits, &r1, 4);
    const uint32_t m = r1_bits & 0xffff0000u & finite;
    std::memcpy(&mf, &m, 4);
    const float r2 = r1 - mf;
    uint32_t l;
    std::memcpy(&l, &r2, 4);
    l &= finite;
    hi[c] = static_cast<uint16_t>(h >> 16);
    mid[c] = static_cast<uint16_t>(m >> 16);
    lo[c] = static_cast<uint16_t>(l >> 16);
  }
}

// One row into Problem::xt's layout, a block of 32 columns at a time.
KIMI_CLONES void SplitRowToBf16x3(uint16_t* __restrict xt, int64_t block_stride,
                                  const float* __restrict x, int64_t k, int64_t kp) {
  for (int64_t b = 0; b < kp / 32; ++b) {
    uint16_t* __restrict hi = xt + b * block_stride;
    uint16_t* __restrict mid = hi + 32;
    uint16_t* __restrict lo = hi + 64;
    if (b < k / 32) {  // a whole block: a loop of known length, vectorised without a remainder
      SplitToBf16x3(hi, mid, lo, x + b * 32, 32);
      continue;
    }
    const int64_t n = std::max<int64_t>(k - b * 32, 0);  // columns of x in this block
    SplitToBf16x3(hi, mid, lo, x + b * 32, n);
    for (int64_t c = n; c < 32; ++c) hi[c] = mid[c] = lo[c] = 0;
  }
}

const Kernels* ScalarKernels() {
  static const Kernels k{"scalar", &ScalarRange};
  return &k;
}

}  // namespace matmul_internal

namespace {

using matmul_internal::Kernels;

bool Available(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return matmul_internal::Avx2Kernels() != nullptr;
    case Isa::kAvx512:
      return matmul_internal::Avx512Kernels() != nullptr;
    case Isa::kAmx:
      return matmul_internal::AmxKernels() != nullptr;
  }
  return false;
}

Isa DefaultIsa() {
  // $KIMI_ISA first: a lower choice never asks Linux for the tile unit (AMX's permission makes
  // the process's signal frames 8 KiB larger).
  if (const char* env = std::getenv("KIMI_ISA")) {
    const std::string_view v(env);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
      if (v == IsaName(isa) && Available(isa)) return isa;
    }
  }
  return Available(Isa::kAmx)      ? Isa::kAmx
         : Available(Isa::kAvx512) ? Isa::kAvx512
         : Available(Isa::kAvx2)   ? Isa::kAvx2
                                   : Isa::kScalar;
}

Isa& CurrentIsa() {
  static Isa isa = DefaultIsa();
  return isa;
}

const Kernels* KernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAmx:
      return matmul_internal::AmxKernels();
    case Isa::kAvx512:
      return matmul_internal::Avx512Kernels();
    case Isa::kAvx2:
      return matmul_internal::Avx2Kernels();
    case Isa::kScalar:
      break;
  }
  return matmul_internal::ScalarKernels();
}

// The activation precision lives in the pool's per-thread context word (bit 0), so the workers
// of a ParallelFor -- and the MatMuls nested in them -- follow the thread that started it.
constexpr uint32_t kBf16Bit = 1;
ActivationDtype CurrentActivation() {
  return ThreadPool::Context() & kBf16Bit ? ActivationDtype::kBf16 : ActivationDtype::kF32;
}

std::mutex stats_mu;
std::atomic<MatMulStats*> g_stats{nullptr};  // read unlocked on every call; written under the lock

void Record(std::span<const MatMulTarget> targets, int64_t m, bool nested, double seconds) {
  std::lock_guard<std::mutex> lock(stats_mu);
  MatMulStats* stats = g_stats.load(std::memory_order_relaxed);
  if (!stats) return;
  MatMulStats::Call call{.m = m,
                         .cols = targets[0].w->cols,
                         .targets = static_cast<int>(targets.size()),
                         .format = targets[0].w->format,
                         .nested = nested,
                         .seconds = seconds};
  for (const MatMulTarget& t : targets) {
    const Weight& w = *t.w;
    stats->calls += 1;
    stats->weight_bytes += w.Bytes();
    stats->flops += 2 * m * w.rows * w.cols;
    stats->reads.push_back({w.data, w.Bytes()});
    call.rows += w.rows;
    call.bytes += w.Bytes();
  }
  stats->timed.push_back(call);
}

// Whether w takes the bf16 dot product while it is on: bf16 weights, and MXFP4 ones (as their
// exact bf16 dequantization). Lane-major packed weights (kLanes, kPairs) are packed so only where
// the machine has no bf16 dot product (kernels/cpu/pack.h), and keep fp32; kTiles weights take
// the tile kernels (Route).
bool Bf16Path(bool bf16_mode, const Weight& w) {
  if (!bf16_mode || (w.packed && w.layout != PackLayout::kBlocks)) return false;
  return w.format == WeightFormat::kBF16 || w.format == WeightFormat::kMxfp4;
}

// Which kernel computes w and which form of x it reads.
enum class XForm { kPermuted, kBf16, kBf16x3 };
struct Route {
  matmul_internal::RangeFn range;
  XForm x;
};
Route RouteFor(const Kernels* kernels, bool bf16_mode, const Weight& w) {
  const bool tiles = w.packed && w.layout == PackLayout::kTiles;
  // Outside AMX (a test that switched the instruction set after packing): the scalar fallback.
  if (tiles && !kernels->range_tiles) {
    return {matmul_internal::ScalarKernels()->range, XForm::kPermuted};
  }
  // With AMX every bf16 or MXFP4 weight of whole blocks takes the tile kernels, packed or not, so
  // a result does not depend on whether its weight was packed (copied) or memory-mapped, nor on a
  // shard's rows. An unpacked MXFP4 weight's tiles are made from its rows at every call (a table
  // decode and a transpose: one x row through a 2048 x 7168 in cache took 1.1-1.3 ms where the
  // packed weight took 0.48 and the AVX-512 kernel 0.51-0.57; at eight rows 1.4 against 1.9 for
  // AVX-512): a mapped checkpoint, a weight whose rows are not whole groups, or one with a scale
  // outside [kTilesMinScale, kTilesMaxScale] on a nonzero code, never packed as tiles (its values
  // below 2^-126 then count as zero: the tile unit reads bf16 subnormals so).
  const bool tile_format = w.format == WeightFormat::kBF16 || w.format == WeightFormat::kMxfp4;
  if (tiles || (kernels->range_tiles && !w.packed && tile_format && w.cols % 32 == 0)) {
    return bf16_mode ? Route{kernels->range_tiles_bf16, XForm::kBf16}
                     : Route{kernels->range_tiles, XForm::kBf16x3};
  }
  if (Bf16Path(bf16_mode, w)) return {kernels->range_bf16, XForm::kBf16};
  return {kernels->range, XForm::kPermuted};
}

// Rows of W handed out together: a multiple of every tile height the kernels use.
constexpr int64_t kRowUnit = 8;

}  // namespace

ActivationScope::ActivationScope(ActivationDtype dtype) : saved_(CurrentActivation()) {
  const uint32_t c = ThreadPool::Context() & ~kBf16Bit;
  ThreadPool::SetContext(dtype == ActivationDtype::kBf16 ? c | kBf16Bit : c);
}
ActivationScope::~ActivationScope() {
  const uint32_t c = ThreadPool::Context() & ~kBf16Bit;
  ThreadPool::SetContext(saved_ == ActivationDtype::kBf16 ? c | kBf16Bit : c);
}

bool HasBf16DotProduct() { return KernelsFor(CurrentIsa())->range_bf16 != nullptr; }

Isa MatMulIsa() { return CurrentIsa(); }

bool SetMatMulIsa(Isa isa) {
  if (!Available(isa)) return false;
  CurrentIsa() = isa;
  return true;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

void SetMatMulStats(MatMulStats* stats) {
  std::lock_guard<std::mutex> lock(stats_mu);
  g_stats.store(stats, std::memory_order_relaxed);
}

void MatMul(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w, int64_t m) {
  const MatMulTarget t{y, ldy, &w};
  MatMulMany({&t, 1}, x, ldx, m);
}

namespace {

// The first bytes of each thread's share of a product RunInShares runs over the global pool, up
// to `cap` bytes and within the target the share starts in; first_unit[j] is target j's first
// unit (first_unit[targets.size()] all units). Returns the number of shares.
int ShareStarts(std::span<const MatMulTarget> targets, const int64_t* first_unit, int64_t tile,
                int64_t cap, ThreadPool::MemoryRange* starts) {
  const int64_t units = first_unit[targets.size()];
  const int shares = ShareCount(ThreadPool::Global());
  for (int t = 0; t < shares; ++t) {
    const int64_t lo = ShareBegin(units, t, shares, tile);
    const int64_t hi = ShareBegin(units, t + 1, shares, tile);
    size_t j = 0;
    while (j + 1 < targets.size() && first_unit[j + 1] <= lo) ++j;
    const Weight& w = *targets[j].w;
    const int64_t row_bytes = w.DataBytes() / w.rows;  // rows (and packed row groups) in order
    const int64_t r0 = (lo - first_unit[j]) * kRowUnit;
    const int64_t r1 =
        std::min((std::min(hi, first_unit[j + 1]) - first_unit[j]) * kRowUnit, w.rows);
    starts[t] = {static_cast<const char*>(w.data) + r0 * row_bytes,
                 std::min(cap, std::max<int64_t>(0, r1 - r0) * row_bytes)};
  }
  return shares;
}

// The products themselves: MatMulMany without its accounting.
void RunMatMulMany(std::span<const MatMulTarget> targets, const float* x, int64_t ldx, int64_t m) {
  const int64_t k = targets[0].w->cols, kp = (k + 31) / 32 * 32;
  for (const MatMulTarget& t : targets) assert(t.w->cols == k);

  // Which targets take the bf16 dot product (opt-in, bf16 weights, machine support).
  const Kernels* kernels = KernelsFor(CurrentIsa());
  const bool bf16_mode = CurrentActivation() == ActivationDtype::kBf16 && kernels->range_bf16;
  constexpr int kMaxTargets = 16;
  assert(targets.size() <= kMaxTargets);
  Route routes[kMaxTargets];
  bool need_f32 = false, need_bf16 = false, need_split = false;
  for (size_t j = 0; j < targets.size(); ++j) {
    routes[j] = RouteFor(kernels, bf16_mode, *targets[j].w);
    switch (routes[j].x) {
      case XForm::kPermuted:
        need_f32 = true;
        break;
      case XForm::kBf16:
        need_bf16 = true;
        break;
      case XForm::kBf16x3:
        need_split = true;
        break;
    }
  }

  // x in the canonical layout (fp32) and/or rounded to bf16 in natural order, in thread-local
  // buffers (so MatMuls nested in other kernels' workers are safe), converted one of two ways:
  //
  // - Up to kMaxPrivateXFloats, every thread that runs a range converts all of x into its own
  //   buffer, once per call (x_serial). With one shared copy, written by the caller and read by
  //   every thread, the caller's next write of it had to take each line back from the other
  //   cores' caches; on the 2-vCPU Zen 4 host that cost 1.7 us per 16 KiB, and 6 us in the
  //   host's phases of slow cross-core traffic (which come and go within minutes), about 10 us a
  //   product in a hot loop then (bf16 512 x 512 at 8 rows: 23 against 34 us; at 32 rows 84
  //   against 100). Steps alternated every ten in one process (median of 4-8 per-pair ratios),
  //   shared against private: k3-mini batch 8 0.996-1.023 (median 1.007 of ten runs), batch 32
  //   1.001-1.025 (1.009 of nine), batch 1 0.990-1.026 (1.003 of five), batch 64 1.007;
  //   kimi-linear-small batch 1 / 8 / 32 1.009 / 0.996-1.008 / 1.001.
  // - Larger x (prefill) is converted once, split over the threads from 16 rows of 512 (32 KiB of
  //   fp32) a part: x was mostly written by the other threads a moment ago, so a row took ~200 ns,
  //   and with the old minimum of 256 KiB a part the caller converted a batch-64 step's rows alone
  //   (2% of its time, the workers idle).
  constexpr int64_t kMaxPrivateXFloats = 64 << 10;
  constexpr int64_t kMinPermuteFloats = 8192;
  static std::atomic<uint64_t> calls{0};
  const uint64_t serial = ++calls;
  thread_local std::vector<float> xp_buffer;
  thread_local std::vector<uint16_t> xb_buffer;
  thread_local std::vector<uint16_t> xt_buffer;
  thread_local uint64_t converted_serial = 0;  // the call whose x this thread's buffers hold
  const bool private_x = m * kp <= kMaxPrivateXFloats;
  // Rows [begin, end) of x into xp / xb / xt (the calling thread's buffers or the caller's).
  const int64_t split_size = matmul_internal::XtSize(m, kp);  // Problem::xt
  const auto convert = [&](float* xp, uint16_t* xb, uint16_t* xt, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (need_f32) matmul_internal::PermuteRow(xp + i * kp, x + i * ldx, k, kp);
      if (need_bf16) matmul_internal::RoundRowToBf16(xb + i * kp, x + i * ldx, k, kp);
      if (need_split) {
        matmul_internal::SplitRowToBf16x3(xt + matmul_internal::XtRowOffset(i, m, kp),
                                          matmul_internal::XtBlockStride(m), x + i * ldx, k, kp);
      }
    }
  };
  // The shared copy, when x is not private: the caller's buffers.
  float* shared_xp = nullptr;
  uint16_t* shared_xb = nullptr;
  uint16_t* shared_xt = nullptr;
  if (!private_x) {
    shared_xp = need_f32 ? CacheLineAligned(xp_buffer, m * kp) : nullptr;
    shared_xb = need_bf16 ? CacheLineAligned(xb_buffer, m * kp) : nullptr;
    shared_xt = need_split ? CacheLineAligned(xt_buffer, split_size) : nullptr;
    ParallelFor(m, std::max<int64_t>(1, kMinPermuteFloats / kp), [&](int64_t begin, int64_t end) {
      convert(shared_xp, shared_xb, shared_xt, begin, end);
    });
  }

  // Units of kRowUnit rows over all targets, in order; each range is a contiguous run of units,
  // so every weight byte is read by one thread. A part gets at least ~64 KiB of weights or
  // ~4 MFLOP, so small matrices do not pay for a dispatch they cannot use.
  int64_t first_unit[kMaxTargets + 1] = {0};
  int64_t bytes = 0;
  // Each target starts on a whole tile of the kernel (AMX: 16 rows, one weight group), so a range
  // boundary never cuts a group that two threads would then both compute.
  const int64_t whole = std::lcm(kernels->tile_units_one, kernels->tile_units_many);
  for (size_t j = 0; j < targets.size(); ++j) {
    const int64_t target_units = (targets[j].w->rows + kRowUnit - 1) / kRowUnit;
    first_unit[j + 1] = first_unit[j] + (target_units + whole - 1) / whole * whole;
    bytes += targets[j].w->Bytes();
  }
  const int64_t units = first_unit[targets.size()];
  if (units == 0) return;
  const int64_t unit_bytes = std::max<int64_t>(1, bytes / units);
  const int64_t unit_flops = 2 * m * k * kRowUnit;
  const int64_t grain = std::max<int64_t>(
      1, std::min(65536 / unit_bytes, (int64_t{4} << 20) / std::max<int64_t>(1, unit_flops)));
  const int64_t threads = ThreadPool::Global().num_threads();
  const int64_t tile = m == 1 ? kernels->tile_units_one : kernels->tile_units_many;
  const auto run_units = [&](int64_t begin, int64_t end) {
    const float* xp = shared_xp;
    const uint16_t* xb = shared_xb;
    const uint16_t* xt = shared_xt;
    if (private_x) {
      float* own_xp = need_f32 ? CacheLineAligned(xp_buffer, m * kp) : nullptr;
      uint16_t* own_xb = need_bf16 ? CacheLineAligned(xb_buffer, m * kp) : nullptr;
      uint16_t* own_xt = need_split ? CacheLineAligned(xt_buffer, split_size) : nullptr;
      if (converted_serial != serial) {
        convert(own_xp, own_xb, own_xt, 0, m);
        converted_serial = serial;
      }
      xp = own_xp;
      xb = own_xb;
      xt = own_xt;
    }
    for (size_t j = 0; j < targets.size(); ++j) {
      const int64_t lo = std::max(begin, first_unit[j]), hi = std::min(end, first_unit[j + 1]);
      if (lo >= hi) continue;
      const Weight& w = *targets[j].w;
      const int64_t n0 = (lo - first_unit[j]) * kRowUnit;
      const int64_t n1 = std::min((hi - first_unit[j]) * kRowUnit, w.rows);
      if (n0 >= n1) continue;  // a unit past the rows, rounding the target to a tile
      matmul_internal::Problem p{targets[j].y, targets[j].ldy, xp, kp, &w, m, xb, serial};
      p.xt = xt;
      routes[j].range(p, n0, n1);
    }
  };
  // Decode-sized x (up to kMaxShareRows rows): each thread streams its own contiguous share
  // (RunInShares). Paired alternations of batch-1 tokens against the ranges below: k3-mini
  // 4.70 / 5.28 / 5.06 / 4.68 -> 4.42 / 4.86 / 4.78 / 4.53 ms, kimi-linear-small
  // 9.49 / 10.02 / 9.88 / 9.20 -> 9.02 / 10.22 / 9.25 / 9.01 ms. Batch-8 steps, alternating every
  // ten steps in one process (the median of ten or five per-pair ratios): k3-mini 0.985 / 0.987 /
  // 0.987 / 0.995, with bf16 activations 0.987, kimi-linear-small 0.989; at 32 rows level (1.000).
  constexpr int64_t kMaxShareRows = 16;
  if (m <= kMaxShareRows && threads > 1 && units >= threads * std::max(grain, tile)) {
    constexpr int64_t kMaxHintRows = 4;
    if (m <= kMaxHintRows && !ThreadPool::InParallelSection()) {
      // For the threads to prefetch while they wait before the next run of this product
      // (next_product.h): up to 256 KiB each, a quarter of a Zen 4 / 5 L2 (a wait of a few
      // microseconds loads less). At a few x rows a product mostly streams its weights: batch-1
      // tokens ran 1.02-1.05x faster (k3-mini; kimi-linear-small 1.01-1.03), steps of 2-4
      // sequences 1.03-1.05x (k3-mini; kimi-linear-small 0.99-1.01); at 8 rows, where the
      // products lean on compute, steps were level with 64 KiB (0.988-1.009) and up to 1.013x
      // slower with 256 KiB.
      ThreadPool::MemoryRange starts[kMaxShares];
      const int shares = ShareStarts(targets, first_unit, tile, 256 << 10, starts);
      matmul_internal::HintNextProduct(ThreadPool::Global(), targets[0].w->data,
                                       {starts, static_cast<size_t>(shares)});
    }
    RunInShares(ThreadPool::Global(), units, grain, tile, run_units);
    return;
  }
  // Otherwise ranges of decreasing length, handed out as threads become free: each takes 1/(2
  // threads) of the units left, at least the grain, in whole tiles of the kernel. With four equal
  // ranges per thread the caller waited about half a range at the end of every call
  // (ThreadPool::Run was 8% of its time in a batch-1 k3-mini token); short last ranges let the
  // threads finish close together. On a shared host a descheduled thread's ranges are picked up
  // by the others.
  constexpr int kMaxRanges = 64;
  int64_t bound[kMaxRanges + 1] = {0};
  int64_t ranges = 0;
  while (bound[ranges] < units) {
    const int64_t left = units - bound[ranges];
    const int64_t want = std::max(grain, left / (2 * threads));
    const int64_t take =
        ranges + 1 == kMaxRanges ? left : std::min(left, (want + tile - 1) / tile * tile);
    bound[ranges + 1] = bound[ranges] + take;
    ++ranges;
  }
  ThreadPool::Global().ParallelForChunks(ranges, 1, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) run_units(bound[r], bound[r + 1]);
  });
}

}  // namespace

void MatMulMany(std::span<const MatMulTarget> targets, const float* x, int64_t ldx, int64_t m) {
  if (m <= 0 || targets.empty()) return;
  if (g_stats.load(std::memory_order_relaxed) == nullptr) {
    RunMatMulMany(targets, x, ldx, m);
    return;
  }
  const bool nested = ThreadPool::InParallelSection();
  const auto start = std::chrono::steady_clock::now();
  RunMatMulMany(targets, x, ldx, m);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  Record(targets, m, nested, took.count());
}

void DequantizeRow(float* out, const Weight& w, int64_t r) {
  const int64_t k = w.cols;
  if (w.packed && w.format == WeightFormat::kBF16 && w.layout == PackLayout::kBlocks &&
      k % 32 == 0) {
    // A block's 32 elements are 16 consecutive pairs: a packed embedding row (a decode step's
    // token rows) without a unit lookup per element.
    const auto* data = static_cast<const uint16_t*>(w.data);
    for (int64_t b = 0; b < k; b += 32) {
      const uint16_t* src = data + 2 * matmul_internal::PackedUnit(w, r, b, 16);
      for (int i = 0; i < 32; ++i) out[b + i] = Bf16ToF32(src[i]);
    }
    return;
  }
  if (w.packed && w.format == WeightFormat::kBF16 && w.layout == PackLayout::kTiles) {
    // A row's pairs of a block lie kTileRows pairs apart (a tied embedding's rows, with one unit
    // lookup a block rather than one an element).
    const auto* data = static_cast<const uint16_t*>(w.data);
    for (int64_t b = 0; b < k; b += 32) {
      const uint16_t* lane0 = data + 2 * matmul_internal::PackedUnit(w, r, b, 16);
      for (int64_t lane = 0; lane < 16; ++lane) {
        out[b + 2 * lane] = Bf16ToF32(lane0[2 * kTileRows * lane]);
        out[b + 2 * lane + 1] = Bf16ToF32(lane0[2 * kTileRows * lane + 1]);
      }
    }
    return;
  }
  if (w.packed) {
    for (int64_t i = 0; i < k; ++i) out[i] = matmul_internal::Element(w, r, i);
    return;
  }
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* src = static_cast<const float*>(w.data) + r * k;
      std::copy(src, src + k, out);
      return;
    }
    case WeightFormat::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * k;
      for (int64_t i = 0; i < k; ++i) out[i] = Bf16ToF32(src[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * k;
      for (int64_t i = 0; i < k; ++i) out[i] = F16ToF32(src[i]);
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (k / 2);
      const uint8_t* s = w.scales + r * (k / 32);
      for (int64_t i = 0; i < k; i += 2) {
        const float scale = matmul_internal::kE8m0[s[i / 32]];
        out[i] = matmul_internal::kE2m1[p[i / 2] & 0xf] * scale;
        out[i + 1] = matmul_internal::kE2m1[p[i / 2] >> 4] * scale;
      }
      return;
    }
  }
}

}  // namespace kimi::cpu
