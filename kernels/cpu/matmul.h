// y = x W^T for a stored weight W [N, K] (bf16, fp16, fp32 or MXFP4) and fp32 activations.
//
// Every output element is one dot product summed in a fixed order that depends only on K, never on
// how many rows x has or how the work is split over threads: a token's result is the same alone or
// in any batch (the scheduler's batch invariance rests on this).
#pragma once

#include <cstdint>

#include "kernels/weight.h"

namespace kimi::cpu {

// y [m, ldy] (first w.rows columns written), x [m, ldx] (first w.cols columns read).
void MatMul(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w, int64_t m);

// Dense form: y [m, w.rows], x [m, w.cols].
inline void MatMul(float* y, const float* x, const Weight& w, int64_t m) {
  MatMul(y, w.rows, x, w.cols, w, m);
}

// Row r of w converted to fp32: out [w.cols]. Used for embedding lookups and references.
void DequantizeRow(float* out, const Weight& w, int64_t r);

}  // namespace kimi::cpu
