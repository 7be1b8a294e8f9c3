#include "kernels/cuda/embedding.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

__global__ void EmbeddingKernel(float* out, const void* data, const uint8_t* scales,
                                WeightFormat format, int64_t rows, int64_t cols, const int32_t* ids,
                                int64_t T) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t id = ids[t];
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      out[t * cols + i] = id >= 0 && id < rows ? dev::WeightAt(data, scales, format, cols, id, i) : 0.0f;
    }
  }
}

}  // namespace

absl::Status EmbeddingGather(float* out, const Weight& table, const int32_t* ids, int64_t T,
                             cudaStream_t stream) {
  if (table.packed) return absl::InvalidArgumentError("EmbeddingGather: packed table");
  if (T <= 0) return absl::OkStatus();
  EmbeddingKernel<<<dev::GridFor(T, 1), 256, 0, stream>>>(out, table.data, table.scales, table.format,
                                                         table.rows, table.cols, ids, T);
  return LaunchStatus("EmbeddingKernel");
}

}  // namespace kimi::cuda
