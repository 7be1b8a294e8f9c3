#include "kernels/cuda/activation.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

enum class Op { kSilu, kSitu, kSigmoid, kMulSigmoid };

constexpr int kThreads = 256;

__global__ void ActivationKernel(float* out, const float* g, const float* u, int64_t n, Op op,
                                 float beta, float linear_beta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gv = g[i];
    float y = 0.0f;
    switch (op) {
      case Op::kSilu:
        y = gv * dev::Sigmoid(gv) * u[i];
        break;
      case Op::kSitu:
        y = beta * tanhf(gv / beta) * dev::Sigmoid(gv) * (linear_beta * tanhf(u[i] / linear_beta));
        break;
      case Op::kSigmoid:
        y = dev::Sigmoid(gv);
        break;
      case Op::kMulSigmoid:
        y = u[i] * dev::Sigmoid(gv);
        break;
    }
    out[i] = y;
  }
}

absl::Status Launch(float* out, const float* g, const float* u, int64_t n, Op op, float beta,
                    float linear_beta, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ActivationKernel<<<dev::GridFor(n, kThreads), kThreads, 0, stream>>>(out, g, u, n, op, beta,
                                                                       linear_beta);
  return LaunchStatus("ActivationKernel");
}

}  // namespace

absl::Status SiluGlu(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream) {
  return Launch(out, gate, up, n, Op::kSilu, 0.0f, 0.0f, stream);
}

absl::Status SituGlu(float* out, const float* gate, const float* up, int64_t n, float beta,
                     float linear_beta, cudaStream_t stream) {
  return Launch(out, gate, up, n, Op::kSitu, beta, linear_beta, stream);
}

absl::Status Sigmoid(float* out, const float* x, int64_t n, cudaStream_t stream) {
  return Launch(out, x, nullptr, n, Op::kSigmoid, 0.0f, 0.0f, stream);
}

absl::Status MulSigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  return Launch(x, gate, x, n, Op::kMulSigmoid, 0.0f, 0.0f, stream);
}

}  // namespace kimi::cuda
