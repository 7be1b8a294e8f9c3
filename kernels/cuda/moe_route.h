// MoE routing on the GPU (kernels/cpu/moe_route.h on the device): fp32 sigmoid scores, the
// correction bias for selection only, grouped top-k (ties: lower id first), weights from the
// unbiased scores, renormalised and scaled. One block per token.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/moe_route.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

constexpr int64_t kMoeMaxExperts = 4096;
constexpr int64_t kMoeMaxTopK = 64;

// ids [T, k] best first, weights [T, k]; logits [T, E] fp32; bias [E] or null.
absl::Status MoeRoute(int32_t* ids, float* weights, const float* logits, const float* bias,
                      int64_t T, const cpu::MoeRouteParams& p, cudaStream_t stream);

}  // namespace kimi::cuda
