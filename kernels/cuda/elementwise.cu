#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

// One block row per output row (grid-stride over rows).
__global__ void CopyRowsKernel(float* out, int64_t ldo, const float* x, int64_t ldx,
                               const int32_t* index, int64_t rows, int64_t width) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t src = index ? index[r] : r;
    float* o = out + r * ldo;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = src >= 0 ? x[src * ldx + i] : 0.0f;
  }
}

__global__ void SplitKernel(uint16_t* hi, uint16_t* lo, const float* x, int64_t ldx, int64_t rows,
                            int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = x[r * ldx + c];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = __bfloat16_as_ushort(h);
    if (lo) lo[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(h)));
  }
}

}  // namespace

absl::Status AddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  AddKernel<<<dev::GridFor(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  return LaunchStatus("AddKernel");
}

absl::Status CopyRows(float* out, int64_t ldo, const float* x, int64_t ldx, const int32_t* index,
                      int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  CopyRowsKernel<<<dev::GridFor(rows, 1), kThreads, 0, stream>>>(out, ldo, x, ldx, index, rows,
                                                                 width);
  return LaunchStatus("CopyRowsKernel");
}

absl::Status SplitToBf16(uint16_t* hi, uint16_t* lo, const float* x, int64_t ldx, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return absl::OkStatus();
  SplitKernel<<<dev::GridFor(rows * cols, kThreads), kThreads, 0, stream>>>(hi, lo, x, ldx, rows,
                                                                            cols);
  return LaunchStatus("SplitKernel");
}

}  // namespace kimi::cuda
