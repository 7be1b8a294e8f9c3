// Depthwise causal 1-D convolution followed by SiLU (fla's ShortConvolution, activation "silu").
#pragma once

#include <cstdint>

namespace kimi::cpu {

// y[t, c] = silu( sum_{j<W} w[c, j] * x[t - (W-1) + j, c] ), tap W-1 on the current token.
// x, y: [T, C] (row stride ldx / ldy); weight: [C, W]; state: [W-1, C], the inputs before x[0]
// (oldest first, zeros for a new sequence), replaced by the last W-1 inputs seen. y must not
// alias x or the state.
void CausalConv1dSilu(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t T, int64_t C,
                      const float* weight, int W, float* state);

}  // namespace kimi::cpu
