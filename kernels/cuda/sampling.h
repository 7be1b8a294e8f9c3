// Token sampling on the GPU, one block per logits row, matching scheduler/sampling.h SampleToken
// (without penalties): greedy at temperature <= 0, else a draw with u = UniformAt(seed, index) --
// a counter-based hash of the request's seed and the index of the token being drawn -- so a
// request's tokens do not depend on the batch it runs in. Temperature, top-k, top-p and min-p
// follow the CPU definitions: candidates ordered by logit (ties: lower id first), the draw walks
// ids in order when nothing filters.
//
// Filters look at the best kSampleMaxCandidates tokens (found by an exact radix select and sorted
// on the device). A row whose top-p or min-p cut reaches past them is flagged `needs_host` (the
// caller samples that row on the host); the flag is also the way out for anything else the
// device does not do (penalties are the caller's to apply to the logits first).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

constexpr int64_t kSampleMaxCandidates = 1024;

struct SampleParams {  // one per row, in device memory
  float temperature = 1.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t index = 0;  // tokens this request has drawn before
};

// tokens [rows], logprobs [rows] (log softmax of the raw row at the chosen token; may be null),
// needs_host [rows] (may be null); logits [rows, vocab] fp32.
absl::Status SampleRows(int32_t* tokens, float* logprobs, int32_t* needs_host, const float* logits,
                        const SampleParams* params, int64_t rows, int64_t vocab,
                        cudaStream_t stream);

// The scheduler's UniformAt(seed, index), for tests.
double UniformAtHost(uint64_t seed, uint64_t index);

}  // namespace kimi::cuda
