#include "kernels/cuda/kda_chunk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 256;

__host__ __device__ inline int64_t PerBlockFloats(int64_t K, int64_t V, int64_t c) { return 6 * c * K + 3 * c * c + c * V + c; }

// One chunk of c tokens starting at token row t0, head h; S [K, V] updated in place. With
// G_i = sum_{s<=i} g_s (per channel), Khat_i = exp(G_i) k_i, Qhat_i = scale exp(G_i) q_i:
//   A_ij = beta_i sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d])   (j < i)
//   P_ij = scale sum_d q_i[d] k_j[d] exp(G_i[d] - G_j[d])    (j <= i)
//   T = (I + A)^-1,  W = T diag(beta) Khat,  U = T diag(beta) V,  u = U - W S_0
//   o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j
//   S_c = diag(exp(G_c)) S_0 + sum_j (exp(G_c - G_j) k_j) u_j^T
// (derivation in kernels/cpu/kda.cc). Every exponent is of a non-positive number.
__device__ void ChunkStep(const KdaChunkArgs& a, float* S, float* ws, int64_t h, int64_t t0, int c,
                          int C) {
  const int64_t H = a.H, K = a.K, V = a.V;
  const int tid = threadIdx.x;
  float* Q = ws;             // [C, K]
  float* Kc = Q + C * K;     // [C, K]
  float* G = Kc + C * K;     // [C, K] cumulative log decay
  float* E = G + C * K;      // [C, K] exp(G)
  float* Wm = E + C * K;     // [C, K] W, later exp(G_c - G_j) k_j
  float* Kh = Wm + C * K;    // [C, K] Khat
  float* A = Kh + C * K;     // [C, C]
  float* Pm = A + C * C;     // [C, C]
  float* Tm = Pm + C * C;    // [C, C]
  float* U = Tm + C * C;     // [C, V]
  float* B = U + C * V;      // [C]

  __syncthreads();  // the previous chunk is done with the workspace and S
  for (int64_t idx = tid; idx < c * K; idx += kThreads) {
    const int64_t i = idx / K, x = idx % K;
    Q[idx] = a.q[((t0 + i) * H + h) * K + x];
    Kc[idx] = a.k[((t0 + i) * H + h) * K + x];
  }
  for (int i = tid; i < c; i += kThreads) B[i] = a.beta[(t0 + i) * H + h];
  for (int64_t x = tid; x < K; x += kThreads) {
    float acc = 0.0f;
    for (int i = 0; i < c; ++i) {
      acc += a.g[((t0 + i) * H + h) * K + x];
      G[i * K + x] = acc;
    }
  }
  __syncthreads();
  for (int64_t idx = tid; idx < c * K; idx += kThreads) {
    E[idx] = expf(G[idx]);
    Kh[idx] = Kc[idx] * E[idx];
  }
  // A and P from pairwise exps; T cleared.
  for (int idx = tid; idx < c * c; idx += kThreads) {
    const int i = idx / c, j = idx % c;
    float av = 0.0f, pv = 0.0f;
    if (j <= i) {
      for (int64_t x = 0; x < K; ++x) {
        const float kj = Kc[j * K + x] * expf(G[i * K + x] - G[j * K + x]);
        av += Kc[i * K + x] * kj;
        pv += Q[i * K + x] * kj;
      }
    }
    A[i * c + j] = j < i ? B[i] * av : 0.0f;
    Pm[i * c + j] = j <= i ? a.scale * pv : 0.0f;
    Tm[i * c + j] = 0.0f;
  }
  __syncthreads();
  // T = (I + A)^-1 by forward substitution: T_i = e_i - sum_{m<i} A_im T_m, a row at a time.
  for (int i = 0; i < c; ++i) {
    for (int mc = tid; mc <= i; mc += kThreads) {
      float acc = 0.0f;
      if (mc < i) {
        for (int m = mc; m < i; ++m) acc -= A[i * c + m] * Tm[m * c + mc];
      } else {
        acc = 1.0f;
      }
      Tm[i * c + mc] = acc;
    }
    __syncthreads();
  }
  // T diag(beta).
  for (int idx = tid; idx < c * c; idx += kThreads) Tm[idx] *= B[idx % c];
  __syncthreads();
  // W = T diag(beta) Khat, U = T diag(beta) V.
  for (int64_t idx = tid; idx < c * K; idx += kThreads) {
    const int64_t i = idx / K, x = idx % K;
    float acc = 0.0f;
    for (int64_t j = 0; j <= i; ++j) acc += Tm[i * c + j] * Kh[j * K + x];
    Wm[idx] = acc;
  }
  for (int64_t idx = tid; idx < c * V; idx += kThreads) {
    const int64_t i = idx / V, y = idx % V;
    float acc = 0.0f;
    for (int64_t j = 0; j <= i; ++j) acc += Tm[i * c + j] * a.v[((t0 + j) * H + h) * V + y];
    U[idx] = acc;
  }
  __syncthreads();
  // u = U - W S_0 (in U).
  for (int64_t idx = tid; idx < c * V; idx += kThreads) {
    const int64_t i = idx / V, y = idx % V;
    float acc = U[idx];
    for (int64_t x = 0; x < K; ++x) acc -= Wm[i * K + x] * S[x * V + y];
    U[idx] = acc;
  }
  __syncthreads();
  // o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j; and Wm <- exp(G_c - G_j) k_j for the state update.
  for (int64_t idx = tid; idx < c * V; idx += kThreads) {
    const int64_t i = idx / V, y = idx % V;
    float acc = 0.0f;
    for (int64_t x = 0; x < K; ++x) acc += a.scale * Q[i * K + x] * E[i * K + x] * S[x * V + y];
    for (int64_t j = 0; j <= i; ++j) acc += Pm[i * c + j] * U[j * V + y];
    a.o[((t0 + i) * H + h) * V + y] = acc;
  }
  for (int64_t idx = tid; idx < c * K; idx += kThreads) {
    const int64_t j = idx / K, x = idx % K;
    Wm[idx] = Kc[idx] * expf(G[(c - 1) * K + x] - G[j * K + x]);
  }
  __syncthreads();
  // S_c = diag(exp(G_c)) S_0 + sum_j Wm_j u_j^T (each element reads only its own S_0 entry).
  for (int64_t idx = tid; idx < K * V; idx += kThreads) {
    const int64_t x = idx / V, y = idx % V;
    float acc = S[idx] * E[(c - 1) * K + x];
    for (int j = 0; j < c; ++j) acc += Wm[j * K + x] * U[j * V + y];
    S[idx] = acc;
  }
}

__global__ void __launch_bounds__(kThreads)
    KdaChunkKernel(KdaChunkArgs a, DeviceBatch b, int64_t min_count) {
  const int64_t h = blockIdx.x, lane = blockIdx.y;
  float* ws = a.workspace + (lane * a.H + h) * PerBlockFloats(a.K, a.V, a.chunk);
  for (int64_t s = lane; s < b.num_seqs; s += gridDim.y) {
    const int64_t n = b.seq_count[s], slot = b.seq_slot[s];
    if (n < min_count || n == 0 || slot < 0) continue;  // uniform over the block
    float* S = a.state + slot * a.slot_stride + h * a.K * a.V;
    const int64_t off = b.seq_offset[s], pos0 = b.seq_pos0[s];
    int64_t t = 0;
    while (t < n) {
      const int64_t to_boundary = a.chunk - (pos0 + t) % a.chunk;
      const int c = static_cast<int>(to_boundary < n - t ? to_boundary : n - t);
      ChunkStep(a, S, ws, h, off + t, c, a.chunk);
      t += c;
    }
  }
}

}  // namespace

int64_t KdaChunkWorkspaceFloats(int64_t H, int64_t K, int64_t V, int chunk, int64_t lanes) {
  return lanes * H * PerBlockFloats(K, V, chunk);
}

absl::Status KdaChunk(const KdaChunkArgs& a, const DeviceBatch& batch, int64_t min_count,
                      cudaStream_t stream) {
  if (a.chunk < 1 || a.chunk > 128) {
    return absl::InvalidArgumentError(absl::StrCat("KdaChunk: chunk ", a.chunk, " outside [1, 128]"));
  }
  if (a.H <= 0 || a.K <= 0 || a.V <= 0 || batch.num_seqs <= 0) return absl::OkStatus();
  const int64_t per_lane = KdaChunkWorkspaceFloats(a.H, a.K, a.V, a.chunk, 1);
  const int64_t lanes = std::min<int64_t>({batch.num_seqs, a.workspace_floats / per_lane, 65535});
  if (lanes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KdaChunk: workspace of ", a.workspace_floats,
                                                   " floats, need ", per_lane));
  }
  const dim3 grid(static_cast<unsigned>(a.H), static_cast<unsigned>(lanes));
  KdaChunkKernel<<<grid, kThreads, 0, stream>>>(a, batch, min_count);
  return LaunchStatus("KdaChunkKernel");
}

}  // namespace kimi::cuda
