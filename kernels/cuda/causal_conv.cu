#include "kernels/cuda/causal_conv.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void ConvKernel(float* y, int64_t ldy, float* state, int64_t slot_stride,
                           const float* x, int64_t ldx, const float* weight, int W, int64_t C,
                           DeviceBatch b, int64_t min_count) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  for (int64_t s = blockIdx.y; s < b.num_seqs; s += gridDim.y) {
    const int64_t n = b.seq_count[s], slot = b.seq_slot[s], off = b.seq_offset[s];
    if (c >= C || n < min_count || n == 0 || slot < 0) continue;
    float* st = state + slot * slot_stride;
    const float* w = weight + c * W;
    float win[kConvMaxWidth];
#pragma unroll
    for (int r = 0; r < kConvMaxWidth; ++r) win[r] = r < W - 1 ? st[r * C + c] : 0.0f;
    for (int64_t t = 0; t < n; ++t) {
      const float xv = x[(off + t) * ldx + c];
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kConvMaxWidth; ++j) {
        if (j < W) acc += w[j] * (j == W - 1 ? xv : win[j]);
      }
      y[(off + t) * ldy + c] = acc * dev::Sigmoid(acc);
#pragma unroll
      for (int r = 0; r < kConvMaxWidth - 1; ++r) {
        if (r < W - 2) win[r] = win[r + 1];
      }
      if (W >= 2) win[W - 2] = xv;
    }
#pragma unroll
    for (int r = 0; r < kConvMaxWidth; ++r) {
      if (r < W - 1) st[r * C + c] = win[r];
    }
  }
}

}  // namespace

absl::Status CausalConvSilu(float* y, int64_t ldy, float* state, int64_t slot_stride,
                            const float* x, int64_t ldx, const float* weight, int W, int64_t C,
                            const DeviceBatch& batch, int64_t min_count, cudaStream_t stream) {
  if (W < 1 || W > kConvMaxWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("CausalConvSilu: width ", W, " outside [1, ", kConvMaxWidth, "]"));
  }
  if (C <= 0 || batch.num_seqs <= 0) return absl::OkStatus();
  const dim3 grid(dev::GridFor(C, kThreads, 1 << 30),
                  static_cast<unsigned>(batch.num_seqs < 65535 ? batch.num_seqs : 65535));
  ConvKernel<<<grid, kThreads, 0, stream>>>(y, ldy, state, slot_stride, x, ldx, weight, W, C,
                                            batch, min_count);
  return LaunchStatus("ConvKernel");
}

}  // namespace kimi::cuda
