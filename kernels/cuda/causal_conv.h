// Depthwise causal conv + SiLU over the prefill sequences of a step, with each sequence's conv
// history read from and written back to its state slot (kernels/cpu/causal_conv.h on the device).
// One thread per (sequence, channel) walks the sequence's tokens in order, so the update in place
// is race-free.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/batch.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

constexpr int kConvMaxWidth = 8;

// For every sequence s with seq_count[s] >= min_count and a slot: tokens t of x [T, C] (row
// stride ldx) give y[t, c] = silu(sum_j weight[c, j] * x[t - (W-1) + j, c]) (row stride ldy),
// where inputs before the sequence's first token come from the history
// state + slot * slot_stride: [W-1, C], oldest first, replaced by the last W-1 inputs.
absl::Status CausalConvSilu(float* y, int64_t ldy, float* state, int64_t slot_stride,
                            const float* x, int64_t ldx, const float* weight, int W, int64_t C,
                            const DeviceBatch& batch, int64_t min_count, cudaStream_t stream);

}  // namespace kimi::cuda
