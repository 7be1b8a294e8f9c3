#include "kernels/cuda/attn_res.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    AttnResKernel(float* out, float* probs, const float* bank, int64_t bank_stride, int nb,
                  const float* partial, const float* w, int64_t H, float eps) {
  __shared__ float scratch[32];
  __shared__ float p[kAttnResMaxRows];
  const int64_t t = blockIdx.x;
  auto row = [&](int j) { return j < nb ? bank + t * bank_stride + j * H : partial + t * H; };
  for (int j = 0; j <= nb; ++j) {
    const float* v = row(j);
    float dot = 0.0f, sq = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += kThreads) {
      dot += v[i] * w[i];
      sq += v[i] * v[i];
    }
    dot = dev::BlockSum(dot, scratch);
    sq = dev::BlockSum(sq, scratch);
    if (threadIdx.x == 0) p[j] = dot / sqrtf(sq / static_cast<float>(H) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int j = 0; j <= nb; ++j) mx = fmaxf(mx, p[j]);
    float denom = 0.0f;
    for (int j = 0; j <= nb; ++j) {
      p[j] = expf(p[j] - mx);
      denom += p[j];
    }
    for (int j = 0; j <= nb; ++j) p[j] /= denom;
    if (probs) {
      for (int j = 0; j <= nb; ++j) probs[t * (nb + 1) + j] = p[j];
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < H; i += kThreads) {
    float acc = 0.0f;
    for (int j = 0; j <= nb; ++j) acc += p[j] * row(j)[i];
    out[t * H + i] = acc;
  }
}

}  // namespace

absl::Status AttnRes(float* out, float* probs, const float* bank, int64_t bank_stride, int64_t nb,
                     const float* partial, const float* w, int64_t T, int64_t H, float eps,
                     cudaStream_t stream) {
  if (nb < 0 || nb + 1 > kAttnResMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttnRes: ", nb, " bank rows (at most ", kAttnResMaxRows - 1, ")"));
  }
  if (T <= 0 || H <= 0) return absl::OkStatus();
  if (T > 0x7fffffff) return absl::InvalidArgumentError("AttnRes: too many tokens");
  AttnResKernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
      out, probs, bank, bank_stride, static_cast<int>(nb), partial, w, H, eps);
  return LaunchStatus("AttnResKernel");
}

}  // namespace kimi::cuda
