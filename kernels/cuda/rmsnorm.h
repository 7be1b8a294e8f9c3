// RMSNorm on the GPU: out[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * weight. Device pointers, fp32.
#pragma once

#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// Returns false (and leaves the CUDA error set) when the launch fails.
bool RmsNorm(float* out, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
             cudaStream_t stream);

}  // namespace kimi::cuda
