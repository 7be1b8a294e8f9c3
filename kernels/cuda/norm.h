// Row normalisations on the GPU (kernels/cpu/norm.h on the device). Device pointers, fp32; the sum
// of squares of a row is reduced in fp32 in an order fixed by the row width alone.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight (weight null: no scale). Rows are
// `ldo` / `ldx` floats apart; out may alias x.
absl::Status RmsNorm(float* out, int64_t ldo, const float* x, int64_t ldx, const float* weight,
                     int64_t rows, int64_t dim, float eps, cudaStream_t stream);
inline absl::Status RmsNorm(float* out, const float* x, const float* weight, int64_t rows,
                            int64_t dim, float eps, cudaStream_t stream) {
  return RmsNorm(out, dim, x, dim, weight, rows, dim, eps, stream);
}

// x[i, :] /= sqrt(sum(x[i, :]^2) + eps), in place (fla's l2norm).
absl::Status L2Norm(float* x, int64_t rows, int64_t dim, float eps, cudaStream_t stream);

// KDA's output norm (fla FusedRMSNormGated, sigmoid): x[i, :] = RMSNorm(x[i, :]) * weight *
// sigmoid(gate[i, :]), in place; x and gate [rows, dim].
absl::Status RmsNormGated(float* x, const float* gate, const float* weight, int64_t rows,
                          int64_t dim, float eps, cudaStream_t stream);

}  // namespace kimi::cuda
