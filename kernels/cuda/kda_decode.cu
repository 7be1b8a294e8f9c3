#include "kernels/cuda/kda_decode.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/causal_conv.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 128;

// One token through the causal conv of channel c (history st[r * C + c], oldest first, shifted in
// place), then SiLU. Same order of additions as kernels/cpu/causal_conv.cc.
__device__ __forceinline__ float ConvStep(float* st, int64_t C, int64_t c, float xv,
                                          const float* w, int W) {
  float acc = 0.0f;
  for (int j = 0; j < W - 1; ++j) acc += w[j] * st[j * C + c];
  acc += w[W - 1] * xv;
  for (int r = 0; r + 1 < W - 1; ++r) st[r * C + c] = st[(r + 1) * C + c];
  if (W >= 2) st[(W - 2) * C + c] = xv;
  return acc * dev::Sigmoid(acc);
}

__global__ void __launch_bounds__(kThreads) KdaDecodeKernel(KdaDecodeArgs a, DeviceBatch b) {
  __shared__ float qs[kKdaMaxHeadDim], ks[kKdaMaxHeadDim], vs[kKdaMaxHeadDim];
  __shared__ float decay[kKdaMaxHeadDim], os[kKdaMaxHeadDim];
  __shared__ float scratch[32];
  const int64_t h = blockIdx.x;
  const int64_t H = a.H, K = a.K, V = a.V, P = H * K;
  for (int64_t s = blockIdx.y; s < b.num_seqs; s += gridDim.y) {
    if (b.seq_count[s] != 1) continue;  // uniform over the block
    const int64_t t = b.seq_offset[s], slot = b.seq_slot[s];
    float* out = a.o + t * H * V + h * V;
    if (slot < 0) {  // padding
      for (int64_t y = threadIdx.x; y < V; y += kThreads) out[y] = 0.0f;
      continue;
    }
    float* base = a.state + slot * a.slot_stride;
    float* S = base + h * K * V;
    float* conv = base + a.conv_offset;
    const int64_t hist = static_cast<int64_t>(a.W - 1) * P;
    __syncthreads();  // the previous sequence's readers of the shared arrays are done
    for (int64_t x = threadIdx.x; x < K; x += kThreads) {
      const int64_t c = h * K + x;
      qs[x] = ConvStep(conv, P, c, a.q_raw[t * a.ld_qkv + c], a.conv_q + c * a.W, a.W);
      ks[x] = ConvStep(conv + hist, P, c, a.k_raw[t * a.ld_qkv + c], a.conv_k + c * a.W, a.W);
      decay[x] = expf(dev::KdaDecay(a.g_raw[t * P + c] + a.dt_bias[c], a.a_log[h],
                                    a.has_lower_bound, a.lower_bound));
    }
    for (int64_t y = threadIdx.x; y < V; y += kThreads) {
      const int64_t c = h * V + y;
      vs[y] = ConvStep(conv + 2 * hist, P, c, a.v_raw[t * a.ld_qkv + c], a.conv_v + c * a.W, a.W);
    }
    // L2 norms of q and k (eps inside the root, on the sum).
    float sq = 0.0f, sk = 0.0f;
    for (int64_t x = threadIdx.x; x < K; x += kThreads) {
      sq += qs[x] * qs[x];
      sk += ks[x] * ks[x];
    }
    sq = dev::BlockSum(sq, scratch);
    sk = dev::BlockSum(sk, scratch);
    const float inv_q = 1.0f / sqrtf(sq + a.l2_eps), inv_k = 1.0f / sqrtf(sk + a.l2_eps);
    for (int64_t x = threadIdx.x; x < K; x += kThreads) {
      qs[x] = qs[x] * inv_q * a.scale;
      ks[x] *= inv_k;
    }
    __syncthreads();
    const float beta = dev::Sigmoid(a.beta_raw[t * H + h]);
    // The recurrence, one state column per thread (columns are independent).
    float ss = 0.0f;
    for (int64_t y = threadIdx.x; y < V; y += kThreads) {
      float kv = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        const float v = S[i * V + y] * decay[i];
        S[i * V + y] = v;
        kv += v * ks[i];
      }
      const float u = beta * (vs[y] - kv);
      float acc = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        const float v = S[i * V + y] + ks[i] * u;
        S[i * V + y] = v;
        acc += v * qs[i];
      }
      os[y] = acc;
      ss += acc * acc;
    }
    ss = dev::BlockSum(ss, scratch);
    const float rstd = 1.0f / sqrtf(ss / static_cast<float>(V) + a.norm_eps);
    for (int64_t y = threadIdx.x; y < V; y += kThreads) {
      out[y] = os[y] * rstd * a.o_norm[y] * dev::Sigmoid(a.gate[t * H * V + h * V + y]);
    }
  }
}

}  // namespace

absl::Status KdaDecode(const KdaDecodeArgs& a, const DeviceBatch& batch, cudaStream_t stream) {
  if (a.K != a.V || a.K <= 0 || a.K > kKdaMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("KdaDecode: head dims K ", a.K, ", V ", a.V,
                                                   " (need K == V <= ", kKdaMaxHeadDim, ")"));
  }
  if (a.W < 1 || a.W > kConvMaxWidth) {
    return absl::InvalidArgumentError(absl::StrCat("KdaDecode: conv width ", a.W));
  }
  if (a.H <= 0 || batch.num_seqs <= 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(a.H),
                  static_cast<unsigned>(batch.num_seqs < 65535 ? batch.num_seqs : 65535));
  KdaDecodeKernel<<<grid, kThreads, 0, stream>>>(a, batch);
  return LaunchStatus("KdaDecodeKernel");
}

}  // namespace kimi::cuda
