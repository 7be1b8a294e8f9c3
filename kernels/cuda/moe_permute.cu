#include "kernels/cuda/moe_permute.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/moe_route.h"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 1024;

// One block: counts (atomics), offsets and tiles (thread 0), then a stable placement by warp 0,
// 32 pairs at a time (peers with the same expert are ranked by lane).
__global__ void __launch_bounds__(kThreads)
    MoePermuteKernel(MoePlan plan, const int32_t* ids, int64_t n, int k, int E, int tile_rows) {
  extern __shared__ int counts[];  // [E], then cursor [E]
  int* cursor = counts + E;
  for (int e = threadIdx.x; e < E; e += kThreads) counts[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int e = ids[i];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, tiles = 0;
    for (int e = 0; e < E; ++e) {
      plan.expert_offset[e] = off;
      cursor[e] = off;
      for (int r = 0; r < counts[e]; r += tile_rows) {
        plan.tile_group[tiles] = e;
        plan.tile_row0[tiles] = off + r;
        plan.tile_row_end[tiles] = off + counts[e];
        ++tiles;
      }
      off += counts[e];
    }
    plan.expert_offset[E] = off;
    plan.num_tiles[0] = tiles;
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  for (int64_t base = 0; base < n; base += 32) {
    const int64_t i = base + lane;
    int e = i < n ? ids[i] : -1;
    if (e >= E) e = -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0) {
      const int r = cursor[e] + rank;
      plan.sorted_token[r] = static_cast<int32_t>(i / k);
      plan.row_of[i] = r;
    } else if (i < n) {
      plan.row_of[i] = -1;
    }
    __syncwarp();
    if (e >= 0 && rank == 0) cursor[e] += __popc(peers);
    __syncwarp();
  }
}

// One block per token; thread 0 orders the token's choices by expert id.
__global__ void MoeCombineKernel(float* out, const float* rows, const int32_t* ids,
                                 const float* weights, const int32_t* row_of, int k, int64_t D) {
  __shared__ int order[kMoeMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int j = 0; j < k; ++j) order[j] = j;
    for (int a = 1; a < k; ++a) {  // insertion sort by expert id
      const int x = order[a];
      int b = a - 1;
      while (b >= 0 && ids[t * k + order[b]] > ids[t * k + x]) {
        order[b + 1] = order[b];
        --b;
      }
      order[b + 1] = x;
    }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int jj = 0; jj < k; ++jj) {
      const int j = order[jj];
      const int64_t r = row_of[t * k + j];
      if (r >= 0) acc += weights[t * k + j] * rows[r * D + d];
    }
    out[t * D + d] = acc;
  }
}

}  // namespace

absl::Status MoePermute(const MoePlan& plan, const int32_t* ids, int64_t T, int64_t k, int64_t E,
                        int64_t tile_rows, cudaStream_t stream) {
  if (E < 1 || E > kMoeMaxExperts || k < 1 || k > kMoeMaxTopK || tile_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoePermute: ", E, " experts, top ", k, ", tile ", tile_rows));
  }
  if (T * k > 0x7fffffff) return absl::InvalidArgumentError("MoePermute: too many rows");
  const size_t smem = 2 * static_cast<size_t>(E) * sizeof(int);
  MoePermuteKernel<<<1, kThreads, smem, stream>>>(plan, ids, T * k, static_cast<int>(k),
                                                  static_cast<int>(E), static_cast<int>(tile_rows));
  return LaunchStatus("MoePermuteKernel");
}

absl::Status MoeCombine(float* out, const float* rows, const int32_t* ids, const float* weights,
                        const int32_t* row_of, int64_t T, int64_t k, int64_t D, cudaStream_t stream) {
  if (k < 1 || k > kMoeMaxTopK) return absl::InvalidArgumentError("MoeCombine: bad top-k");
  if (T <= 0 || D <= 0) return absl::OkStatus();
  if (T > 0x7fffffff) return absl::InvalidArgumentError("MoeCombine: too many tokens");
  MoeCombineKernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(out, rows, ids, weights, row_of,
                                                                 static_cast<int>(k), D);
  return LaunchStatus("MoeCombineKernel");
}

}  // namespace kimi::cuda
