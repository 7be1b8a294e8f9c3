// y = x W^T for a stored weight W [N, K] (bf16, fp16, fp32 or MXFP4) and fp32 activations.
//
// Every output element is one dot product summed in a fixed order that depends only on K, never on
// how many rows x has, which tile or thread computes it, or (AMX's tile weights aside, Isa below)
// which instruction set runs (AVX-512 and AVX2 agree bit for bit; the order is written down in
// matmul_impl.h): a token's result is the same alone or in any batch (the scheduler's batch
// invariance rests on this).
//
// Weights are read in their stored format, converted in registers and accumulated in fp32. Rows of
// x are processed in blocks that stay in cache while each weight tile is read once per block, so a
// batched decode step or a prefill chunk reads every weight matrix from memory about once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/weight.h"

namespace kimi::cpu {

// y [m, ldy] (first w.rows columns written), x [m, ldx] (first w.cols columns read).
void MatMul(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w, int64_t m);

// Dense form: y [m, w.rows], x [m, w.cols].
inline void MatMul(float* y, const float* x, const Weight& w, int64_t m) {
  MatMul(y, w.rows, x, w.cols, w, m);
}

// Several products of the same x in one parallel pass (one dispatch, the rows of all weights shared
// out among the threads): y_j = x W_j^T. Every W_j must have the same cols. Results equal separate
// MatMul calls bit for bit.
struct MatMulTarget {
  float* y;
  int64_t ldy;
  const Weight* w;
};
void MatMulMany(std::span<const MatMulTarget> targets, const float* x, int64_t ldx, int64_t m);

// Row r of w converted to fp32: out [w.cols]. Used for embedding lookups and references.
void DequantizeRow(float* out, const Weight& w, int64_t r);

// Activation precision (DESIGN.md: fp32 by default; bf16 an opt-in for faster prefill with its
// own, looser tolerance). While an ActivationScope(kBf16) is alive on a thread, the MatMuls it
// issues round x to bf16 (nearest even) and, for bf16 and MXFP4 weights (an MXFP4 weight is exact
// in bf16) on a machine with AVX-512 BF16, use the bf16 dot product (vdpbf16ps, fp32
// accumulation); other weights and machines keep the fp32 path. Results still depend on K alone,
// never on m or the thread split.
enum class ActivationDtype { kF32, kBf16 };
class ActivationScope {
 public:
  explicit ActivationScope(ActivationDtype dtype);
  ~ActivationScope();
  ActivationScope(const ActivationScope&) = delete;
  ActivationScope& operator=(const ActivationScope&) = delete;

 private:
  ActivationDtype saved_;
};
// True when this machine runs bf16 activations on the bf16 dot product.
bool HasBf16DotProduct();

// The instruction set MatMul uses: the best the machine has, or $KIMI_ISA (amx, avx512, avx2,
// scalar) when that is available. SetMatMulIsa is for tests and benchmarks (not thread-safe against
// running MatMuls); it returns false, changing nothing, when the machine lacks `isa`.
//
// kAmx is AVX-512 plus Intel's tile unit (AMX-BF16) for bf16 and MXFP4 weights of whole 32-column
// blocks, packed as kTiles (pack.h) or not: those sum in AMX's orders (matmul_amx.cc, one for each
// format), fp32 activations through an exact three-term bf16 split, so their bits differ from the
// other instruction sets' (within fp32 rounding) but not between a packed and a memory-mapped
// weight; every other weight, and every other kernel, is AVX-512's. So on AMX an MXFP4 weight's
// product no longer equals, bit for bit, that of its bf16 dequantization, as it does elsewhere.
enum class Isa { kScalar, kAvx2, kAvx512, kAmx };
// True for kAvx512 and kAmx (the AVX-512 kernels of the other ops).
constexpr bool HasAvx512(Isa isa) { return isa == Isa::kAvx512 || isa == Isa::kAmx; }
Isa MatMulIsa();
bool SetMatMulIsa(Isa isa);
const char* IsaName(Isa isa);

// Optional accounting for benchmarks: while a MatMulStats is installed, every MatMul (from any
// thread) adds its weight bytes and flops and records which weight it read, so callers can count
// distinct bytes, and how long each call took, so they can see where a step's time goes by shape.
// Installing nullptr stops it; it costs nothing when not installed.
struct MatMulStats {
  struct Read {
    const void* data;
    int64_t bytes;
  };
  // One MatMul or MatMulMany call, timed from entry to return (two clock reads and a lock).
  struct Call {
    int64_t m = 0;
    int64_t rows = 0;  // summed over the targets
    int64_t cols = 0;
    int64_t bytes = 0;  // weight bytes, summed over the targets
    int targets = 0;
    WeightFormat format = WeightFormat::kF32;  // the first target's
    bool nested = false;  // issued inside a parallel section: ran on its one thread
    double seconds = 0.0;
  };
  int64_t calls = 0;         // targets, counted one by one
  int64_t weight_bytes = 0;  // summed over calls (a weight read twice counts twice)
  int64_t flops = 0;         // 2 * m * rows * cols per call
  std::vector<Read> reads;   // one per target
  std::vector<Call> timed;   // one per call
};
void SetMatMulStats(MatMulStats* stats);

}  // namespace kimi::cpu
