// MLA attention in the absorbed (latent) form over the paged latent cache, for decode tokens and
// prefill chunks alike (kernels/cpu/mla.h MlaLatentAttention on the device). Each query row
// (token, head) attends causally to positions 0 .. tok_pos[t] of its sequence:
//     out_lat[t, h] = sum_s softmax_s(scale * qa[t, h] . cache_s) c_s          (c_s = first `rank`)
// with an online softmax over tiles of keys. A row's result depends only on its query and the
// cache rows it sees (batch-invariant). Padding tokens (tok_seq < 0) give zeros.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/batch.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

constexpr int64_t kMlaMaxRank = 1024;
constexpr int64_t kMlaMaxWidth = 2048;  // rank + rope

// out_lat [T, heads, rank]; qa [T, heads, rank + rope] (absorbed queries W_UK^T q_nope | q_pe);
// cache: one layer's pool [num_pages, page_size, rank + rope].
absl::Status MlaLatentAttention(float* out_lat, const float* qa, const float* cache,
                                const DeviceBatch& batch, int64_t heads, int64_t rank,
                                int64_t rope, int64_t page_size, float scale, cudaStream_t stream);

}  // namespace kimi::cuda
