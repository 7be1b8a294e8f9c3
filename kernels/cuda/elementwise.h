// Small data-movement ops the forward pass needs between kernels (device pointers).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// y[i] += x[i] over n floats.
absl::Status AddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream);

// out[r, :width] = x[index[r], :width] for r < rows (index null: row r), rows `ldo` / `ldx`
// floats apart. A negative index writes zeros.
absl::Status CopyRows(float* out, int64_t ldo, const float* x, int64_t ldx, const int32_t* index,
                      int64_t rows, int64_t width, cudaStream_t stream);

// Activations for a bf16 GEMM: hi[r, :] = bf16(x[r, :]) (round to nearest even) and, when lo is not
// null, lo[r, :] = bf16(x - hi), so that hi + lo carries x to about 2^-17 relative. x [rows, cols]
// with row stride ldx; hi, lo dense [rows, cols] (uint16 bf16 bits).
absl::Status SplitToBf16(uint16_t* hi, uint16_t* lo, const float* x, int64_t ldx, int64_t rows,
                         int64_t cols, cudaStream_t stream);

}  // namespace kimi::cuda
