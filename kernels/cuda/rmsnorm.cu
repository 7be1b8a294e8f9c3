#include <cuda_runtime.h>

#include "kernels/cuda/rmsnorm.h"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; a shared-memory tree reduction of the sum of squares.
__global__ void RmsNormKernel(float* out, const float* x, const float* weight, int64_t dim,
                              float eps) {
  __shared__ float partial[kThreads];
  const float* xr = x + blockIdx.x * dim;
  float* outr = out + blockIdx.x * dim;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) acc += xr[i] * xr[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  const float rstd = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) outr[i] = xr[i] * rstd * weight[i];
}

}  // namespace

bool RmsNorm(float* out, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
             cudaStream_t stream) {
  if (rows == 0) return true;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(out, x, weight, dim, eps);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace kimi::cuda
