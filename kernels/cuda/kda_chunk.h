// Chunked KDA for prefill (kernels/cpu/kda.h KdaChunk on the device): the gated delta rule 64
// tokens at a time in the WY/UT form, fp32 state updated in place in each sequence's slot.
// Chunks sit on the absolute grid of `chunk` tokens (a sequence with pos0 tokens already in its
// state first runs up to the next multiple), as on the CPU. One block per (head, sequence lane);
// the chunk's matrices live in a global workspace.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/batch.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

struct KdaChunkArgs {
  float* o = nullptr;  // [T, H, V]
  // Recurrent state [H, K, V] of a slot at state + slot * slot_stride.
  float* state = nullptr;
  int64_t slot_stride = 0;
  const float* q = nullptr;  // [T, H, K], L2-normalised (scale is applied here)
  const float* k = nullptr;  // [T, H, K], L2-normalised
  const float* v = nullptr;  // [T, H, V]
  const float* g = nullptr;  // [T, H, K] log decay (<= 0)
  const float* beta = nullptr;  // [T, H]
  int64_t H = 0, K = 0, V = 0;
  float scale = 1.0f;
  int chunk = 64;
  float* workspace = nullptr;  // KdaChunkWorkspaceFloats(...) floats
  int64_t workspace_floats = 0;
};

// Floats of workspace for `lanes` sequences processed side by side (each lane runs its
// sequences one after another); KdaChunk uses as many lanes as the workspace holds.
int64_t KdaChunkWorkspaceFloats(int64_t H, int64_t K, int64_t V, int chunk, int64_t lanes);

// Runs every sequence with seq_count >= min_count and a slot.
absl::Status KdaChunk(const KdaChunkArgs& args, const DeviceBatch& batch, int64_t min_count,
                      cudaStream_t stream);

}  // namespace kimi::cuda
