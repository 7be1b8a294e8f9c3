// y = x W^T with W in its stored format (fp32, fp16, bf16 or MXFP4, row-major [n, k] in device
// memory, not packed), x fp32, fp32 accumulation. Weights are converted on the fly: every 32-column
// slice of a weight tile is dequantised into shared memory (MXFP4: E2M1 code x E8M0 scale, exact
// in fp32) and never exists as a whole dequantised copy.
//
// Every output element is one dot product summed in ascending k, whatever tile, batch or group it
// lands in, so a row's result never depends on the other rows (batch invariance).
//
// Three shapes of one kernel: dense, batched (per-head weight slices, MLA) and grouped (MoE experts:
// rows sorted by expert, tiles planned on the device by MoePermute).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/weight.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// Rows per tile of the grouped form (MoePermute's tile_rows).
constexpr int64_t kWeightGemmTileRows = 16;

// y [m, w.rows] (row stride ldy), x [m, w.cols] (row stride ldx).
absl::Status WeightGemm(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                        int64_t m, cudaStream_t stream);

// Problem b < batch: y + b * y_stride = (x + b * x_stride) * (rows [b * w_row_stride, + n) of w)^T.
absl::Status WeightGemmBatched(float* y, int64_t ldy, int64_t y_stride, const float* x,
                               int64_t ldx, int64_t x_stride, const Weight& w, int64_t n,
                               int64_t w_row_stride, int64_t m, int64_t batch,
                               cudaStream_t stream);

// Grouped: tile i < *num_tiles covers rows [tile_row0[i], min(tile_row0[i] + kWeightGemmTileRows,
// tile_row_end[i])) of x and y, multiplied by group tile_group[i]'s weight, rows
// [g * n, (g + 1) * n) of w. Tiles from *num_tiles to max_tiles idle.
absl::Status WeightGemmGrouped(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                               int64_t n, const int32_t* tile_group, const int32_t* tile_row0,
                               const int32_t* tile_row_end, const int32_t* num_tiles,
                               int64_t max_tiles, cudaStream_t stream);

}  // namespace kimi::cuda
