#include "kernels/cuda/mla_attention.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;                          // keys per online-softmax step
constexpr int kAcc = kMlaMaxRank / kThreads;       // latent columns per thread

// One block per (token, head).
__global__ void __launch_bounds__(kThreads)
    MlaLatentKernel(float* out_lat, const float* qa, const float* cache, DeviceBatch b,
                    int64_t heads, int64_t rank, int64_t rope, int64_t page_size, float scale) {
  __shared__ float q[kMlaMaxWidth];
  __shared__ float sc[kTile];
  __shared__ float p[kTile];
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t width = rank + rope;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* out = out_lat + (t * heads + h) * rank;
  const int64_t s = b.tok_seq[t];
  if (s < 0) {
    for (int64_t r = threadIdx.x; r < rank; r += kThreads) out[r] = 0.0f;
    return;
  }
  const int64_t n_keys = static_cast<int64_t>(b.tok_pos[t]) + 1;
  const int32_t* pages = b.pages + b.seq_page_start[s];
  auto key = [&](int64_t pos) {
    return cache + (static_cast<int64_t>(pages[pos / page_size]) * page_size + pos % page_size) * width;
  };
  for (int64_t d = threadIdx.x; d < width; d += kThreads) q[d] = qa[(t * heads + h) * width + d];
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  __syncthreads();
  for (int64_t s0 = 0; s0 < n_keys; s0 += kTile) {
    const int nk = static_cast<int>(n_keys - s0 < kTile ? n_keys - s0 : kTile);
    for (int j = warp; j < nk; j += kWarps) {
      const float* kr = key(s0 + j);
      float dot = 0.0f;
      for (int64_t d = lane; d < width; d += 32) dot += q[d] * kr[d];
      dot = dev::WarpSum(dot);
      if (lane == 0) sc[j] = dot * scale;
    }
    __syncthreads();
    float mt = m;
    for (int j = 0; j < nk; ++j) mt = fmaxf(mt, sc[j]);
    const float corr = expf(m - mt);  // 0 on the first tile (m = -inf)
    if (threadIdx.x < nk) p[threadIdx.x] = expf(sc[threadIdx.x] - mt);
    __syncthreads();
    float tile_sum = 0.0f;
    for (int j = 0; j < nk; ++j) tile_sum += p[j];
    l = l * corr + tile_sum;
    m = mt;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int64_t r = threadIdx.x + static_cast<int64_t>(i) * kThreads;
      if (r < rank) {
        float a = acc[i] * corr;
        for (int j = 0; j < nk; ++j) a += p[j] * key(s0 + j)[r];
        acc[i] = a;
      }
    }
    __syncthreads();  // sc and p are rewritten by the next tile
  }
  const float inv = n_keys > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int64_t r = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    if (r < rank) out[r] = acc[i] * inv;
  }
}

}  // namespace

absl::Status MlaLatentAttention(float* out_lat, const float* qa, const float* cache,
                                const DeviceBatch& batch, int64_t heads, int64_t rank,
                                int64_t rope, int64_t page_size, float scale, cudaStream_t stream) {
  if (rank <= 0 || rank > kMlaMaxRank || rope < 0 || rank + rope > kMlaMaxWidth) {
    return absl::InvalidArgumentError(absl::StrCat("MlaLatentAttention: rank ", rank, ", rope ",
                                                   rope, " (rank <= ", kMlaMaxRank, ")"));
  }
  if (page_size <= 0) return absl::InvalidArgumentError("MlaLatentAttention: page_size <= 0");
  if (batch.num_tokens <= 0 || heads <= 0) return absl::OkStatus();
  if (heads > 65535 || batch.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("MlaLatentAttention: ", heads, " heads x ",
                                                   batch.num_tokens, " tokens exceeds the grid"));
  }
  const dim3 grid(static_cast<unsigned>(batch.num_tokens), static_cast<unsigned>(heads));
  MlaLatentKernel<<<grid, kThreads, 0, stream>>>(out_lat, qa, cache, batch, heads, rank, rope,
                                                 page_size, scale);
  return LaunchStatus("MlaLatentKernel");
}

}  // namespace kimi::cuda
