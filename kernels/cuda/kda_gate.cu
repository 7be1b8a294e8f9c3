#include "kernels/cuda/kda_gate.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void KdaGateKernel(float* g, const float* g_raw, const float* a_log,
                              const float* dt_bias, bool has_lb, float lb, int64_t T, int64_t H,
                              int64_t K) {
  const int64_t n = T * H * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t hk = i % (H * K);
    g[i] = dev::KdaDecay(g_raw[i] + dt_bias[hk], a_log[hk / K], has_lb, lb);
  }
}

}  // namespace

absl::Status KdaGate(float* g, const float* g_raw, const float* a_log, const float* dt_bias,
                     std::optional<float> lower_bound, int64_t T, int64_t H, int64_t K,
                     cudaStream_t stream) {
  if (T <= 0 || H <= 0 || K <= 0) return absl::OkStatus();
  KdaGateKernel<<<dev::GridFor(T * H * K, kThreads), kThreads, 0, stream>>>(
      g, g_raw, a_log, dt_bias, lower_bound.has_value(), lower_bound.value_or(0.0f), T, H, K);
  return LaunchStatus("KdaGateKernel");
}

}  // namespace kimi::cuda
