// Block Attention Residuals on the GPU (kernels/cpu/attn_res.h on the device): per token, a
// softmax over depth of the closed block rows and the partial sum, scored against the folded
// pseudo-query w, mixes the raw rows. One block per token, fp32 throughout.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

constexpr int64_t kAttnResMaxRows = 64;  // nb + 1 (K3 has at most 9)

// bank: token t's row j at bank + t * bank_stride + j * H; partial, out [T, H] (out must not alias
// them); w [H]; probs [T, nb + 1] or null.
absl::Status AttnRes(float* out, float* probs, const float* bank, int64_t bank_stride, int64_t nb,
                     const float* partial, const float* w, int64_t T, int64_t H, float eps,
                     cudaStream_t stream);

}  // namespace kimi::cuda
