// KDA decay gate on the GPU (kernels/cpu/kda.h KdaGate): g [T, H, K] from the low-rank gate
// output g_raw [T, H, K] (in place allowed), dt_bias [H * K], a_log [H].
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

absl::Status KdaGate(float* g, const float* g_raw, const float* a_log, const float* dt_bias,
                     std::optional<float> lower_bound, int64_t T, int64_t H, int64_t K,
                     cudaStream_t stream);

}  // namespace kimi::cuda
