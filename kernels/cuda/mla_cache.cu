#include "kernels/cuda/mla_cache.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

__global__ void MlaWriteCacheKernel(float* cache, const float* rows, int64_t ld, DeviceBatch b,
                                    int64_t width, int64_t page_size) {
  for (int64_t t = blockIdx.x; t < b.num_tokens; t += gridDim.x) {
    const int64_t s = b.tok_seq[t];
    if (s < 0) continue;
    const int64_t pos = b.tok_pos[t];
    const int64_t page = b.pages[b.seq_page_start[s] + pos / page_size];
    float* dst = cache + (page * page_size + pos % page_size) * width;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = rows[t * ld + i];
  }
}

}  // namespace

absl::Status MlaWriteCache(float* cache, const float* rows, int64_t ld, const DeviceBatch& batch,
                           int64_t width, int64_t page_size, cudaStream_t stream) {
  if (batch.num_tokens <= 0 || width <= 0) return absl::OkStatus();
  if (page_size <= 0) return absl::InvalidArgumentError("MlaWriteCache: page_size <= 0");
  MlaWriteCacheKernel<<<dev::GridFor(batch.num_tokens, 1), 128, 0, stream>>>(cache, rows, ld, batch,
                                                                            width, page_size);
  return LaunchStatus("MlaWriteCacheKernel");
}

}  // namespace kimi::cuda
