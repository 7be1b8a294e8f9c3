#include "kernels/cuda/norm.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. kind 0: RMSNorm (optional weight); 1: L2 norm; 2: gated RMSNorm.
__global__ void __launch_bounds__(kThreads)
    NormKernel(float* out, int64_t ldo, const float* x, int64_t ldx, const float* weight,
               const float* gate, int64_t dim, float eps, int kind) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * ldx;
  float* outr = out + row * ldo;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) acc += xr[i] * xr[i];
  const float sum = dev::BlockSum(acc, scratch);
  const float r = kind == 1 ? 1.0f / sqrtf(sum + eps) : 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float y = xr[i] * r;
    if (weight) y *= weight[i];
    if (kind == 2) y *= dev::Sigmoid(gate[row * dim + i]);
    outr[i] = y;
  }
}

absl::Status Launch(float* out, int64_t ldo, const float* x, int64_t ldx, const float* weight,
                    const float* gate, int64_t rows, int64_t dim, float eps, int kind,
                    cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("norm: too many rows");
  NormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(out, ldo, x, ldx, weight, gate,
                                                                   dim, eps, kind);
  return LaunchStatus("NormKernel");
}

}  // namespace

absl::Status RmsNorm(float* out, int64_t ldo, const float* x, int64_t ldx, const float* weight,
                     int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  return Launch(out, ldo, x, ldx, weight, nullptr, rows, dim, eps, 0, stream);
}

absl::Status L2Norm(float* x, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  return Launch(x, dim, x, dim, nullptr, nullptr, rows, dim, eps, 1, stream);
}

absl::Status RmsNormGated(float* x, const float* gate, const float* weight, int64_t rows,
                          int64_t dim, float eps, cudaStream_t stream) {
  return Launch(x, dim, x, dim, weight, gate, rows, dim, eps, 2, stream);
}

}  // namespace kimi::cuda
