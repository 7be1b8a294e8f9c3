// Writes a step's new latent rows into the paged MLA cache: token t of sequence tok_seq[t] at
// position tok_pos[t] goes to page pages[page_start + pos / page_size], slot pos % page_size.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/batch.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// cache: one layer's pool [num_pages, page_size, width]; rows [T, width] with row stride ld.
// Padding tokens (tok_seq < 0) write nothing.
absl::Status MlaWriteCache(float* cache, const float* rows, int64_t ld, const DeviceBatch& batch,
                           int64_t width, int64_t page_size, cudaStream_t stream);

}  // namespace kimi::cuda
