#include "kernels/cuda/moe_route.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

struct Params {
  int E, k, groups, topk_groups;
  bool renormalize;
  float scaling;
};

// (value, id) with the larger value first, the lower id on ties.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads)
    MoeRouteKernel(int32_t* ids, float* weights, const float* logits, const float* bias, Params p) {
  extern __shared__ float smem[];
  float* score = smem;                                          // [E]
  float* biased = score + p.E;                                  // [E]
  unsigned char* allowed = reinterpret_cast<unsigned char*>(biased + p.E);  // [E]
  __shared__ float group_score[64];
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  __shared__ int chosen[kMoeMaxTopK];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < p.E; e += kThreads) {
    score[e] = dev::Sigmoid(logits[t * p.E + e]);
    biased[e] = score[e] + (bias ? bias[e] : 0.0f);
    allowed[e] = 1;
  }
  __syncthreads();
  // Group stage: a group's score is the sum of its two best biased scores; keep the best groups.
  if (p.groups > 1) {
    const int per = p.E / p.groups;
    for (int g = threadIdx.x; g < p.groups; g += kThreads) {
      float best = -INFINITY, second = -INFINITY;
      for (int j = 0; j < per; ++j) {
        const float v = biased[g * per + j];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score[g] = per > 1 ? best + second : best;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long kept = 0;
      for (int r = 0; r < p.topk_groups; ++r) {
        int bi = -1;
        for (int g = 0; g < p.groups; ++g) {
          if ((kept >> g) & 1ull) continue;
          if (bi < 0 || group_score[g] > group_score[bi]) bi = g;
        }
        if (bi >= 0) kept |= 1ull << bi;
      }
      for (int g = 0; g < p.groups; ++g) {
        if (!((kept >> g) & 1ull)) {
          for (int j = 0; j < per; ++j) allowed[g * per + j] = 0;
        }
      }
    }
    __syncthreads();
  }
  // Top-k by repeated arg-max over the allowed experts.
  for (int r = 0; r < p.k; ++r) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < p.E; e += kThreads) {
      if (allowed[e] && Better(biased[e], e, bv, bi)) {
        bv = biased[e];
        bi = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (Better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      best_v[warp] = bv;
      best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = best_v[0];
      int i = best_i[0];
      for (int w = 1; w < kThreads / 32; ++w) {
        if (Better(best_v[w], best_i[w], v, i)) {
          v = best_v[w];
          i = best_i[w];
        }
      }
      if (i < 0 || i >= p.E) i = 0;  // fewer allowed experts than k: cannot happen for valid params
      chosen[r] = i;
      allowed[i] = 0;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int r = 0; r < p.k; ++r) sum += score[chosen[r]];
    for (int r = 0; r < p.k; ++r) {
      float w = score[chosen[r]];
      if (p.renormalize) w /= sum + 1e-20f;
      ids[t * p.k + r] = chosen[r];
      weights[t * p.k + r] = w * p.scaling;
    }
  }
}

}  // namespace

absl::Status MoeRoute(int32_t* ids, float* weights, const float* logits, const float* bias,
                      int64_t T, const cpu::MoeRouteParams& p, cudaStream_t stream) {
  const int64_t groups = p.num_groups < 1 ? 1 : p.num_groups;
  if (p.num_experts < 1 || p.num_experts > kMoeMaxExperts || p.top_k < 1 ||
      p.top_k > kMoeMaxTopK || groups > 64 || p.num_experts % groups != 0 ||
      (groups > 1 && (p.topk_groups < 1 || p.topk_groups > groups ||
                      p.topk_groups * (p.num_experts / groups) < p.top_k)) ||
      p.top_k > p.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: ", p.num_experts, " experts, top ",
                                                   p.top_k, ", ", p.num_groups, " groups (keep ",
                                                   p.topk_groups, ") unsupported"));
  }
  if (T <= 0) return absl::OkStatus();
  if (T > 0x7fffffff) return absl::InvalidArgumentError("MoeRoute: too many tokens");
  const Params kp{static_cast<int>(p.num_experts), static_cast<int>(p.top_k),
                  static_cast<int>(groups), static_cast<int>(p.topk_groups), p.renormalize,
                  p.scaling};
  const size_t smem = static_cast<size_t>(p.num_experts) * (2 * sizeof(float) + 1);
  MoeRouteKernel<<<static_cast<unsigned>(T), kThreads, smem, stream>>>(ids, weights, logits, bias,
                                                                        kp);
  return LaunchStatus("MoeRouteKernel");
}

}  // namespace kimi::cuda
