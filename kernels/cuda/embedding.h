// Embedding lookup on the GPU: out[t, :] = table[ids[t], :] as fp32, the table in its stored
// format (device memory). An id outside [0, rows) gives a zero row (the host validates ids first).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/weight.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

absl::Status EmbeddingGather(float* out, const Weight& table, const int32_t* ids, int64_t T,
                             cudaStream_t stream);

}  // namespace kimi::cuda
