#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

// Row pointers into token-major [T, H, X] tensors.
inline const float* At(const float* base, int64_t t, int64_t h, int64_t H, int64_t X) {
  return base + (t * H + h) * X;
}

void RecurrentHead(float* o, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* S, const KdaDims& d, int64_t h, float scale) {
  const int64_t K = d.K, V = d.V, H = d.H;
  std::vector<float> kv(V), u(V), out(V);
  for (int64_t t = 0; t < d.T; ++t) {
    const float* qt = At(q, t, h, H, K);
    const float* kt = At(k, t, h, H, K);
    const float* vt = At(v, t, h, H, V);
    const float* gt = At(g, t, h, H, K);
    const float bt = beta[t * H + h];
    // S = diag(exp(g)) S, and kv = S^T k on the decayed state, in one pass.
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float decay = std::exp(gt[i]);
      const float ki = kt[i];
      for (int64_t j = 0; j < V; ++j) {
        row[j] *= decay;
        kv[j] += row[j] * ki;
      }
    }
    for (int64_t j = 0; j < V; ++j) u[j] = bt * (vt[j] - kv[j]);
    // S += k u^T, and o = S^T (scale q) on the updated state.
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = kt[i];
      const float qi = qt[i] * scale;
      for (int64_t j = 0; j < V; ++j) {
        row[j] += ki * u[j];
        out[j] += row[j] * qi;
      }
    }
    std::copy(out.begin(), out.end(), o + (t * H + h) * V);
  }
}

// Scratch for one chunk of one head.
struct ChunkScratch {
  std::vector<float> G, A, P, Tm, W, U, x;
  ChunkScratch(int64_t c, int64_t K, int64_t V)
      : G(c * K), A(c * c), P(c * c), Tm(c * c), W(c * K), U(c * V), x(std::max(K, V)) {}
};

// One chunk of c tokens starting at token t0, for head h; S [K, V] is updated in place.
//
// Write G_i = sum_{s<=i} g_s (cumulative log decay inside the chunk, per channel) and
// X_i = diag(exp(-G_i)) S_i. The recurrence becomes X_i = X_{i-1} + (k_i / exp(G_i)) u_i^T with
//     u_i = beta_i (v_i - S_0^T (exp(G_i) k_i) - sum_{j<i} A_ij u_j),
//     A_ij = sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d]).
// In matrix form (I + diag(beta) A) u = diag(beta) (V - Khat S_0), Khat_i = exp(G_i) k_i. With the
// UT transform T = (I + diag(beta) A)^-1 (unit lower triangular):
//     W = T diag(beta) Khat,  U = T diag(beta) V,  u = U - W S_0                 (the WY/UT form)
//     o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j,  Qhat_i = scale exp(G_i) q_i,
//     P_ij = scale sum_d q_i[d] k_j[d] exp(G_i[d] - G_j[d])
//     S_c = diag(exp(G_c)) S_0 + sum_j (exp(G_c - G_j) k_j) u_j^T
// Every exponent is of a non-positive number (g <= 0 and j <= i), so nothing overflows.
void ChunkHead(float* o, const float* q, const float* k, const float* v, const float* g,
               const float* beta, float* S, const KdaDims& d, int64_t h, float scale, int64_t t0,
               int64_t c, ChunkScratch& s) {
  const int64_t K = d.K, V = d.V, H = d.H;
  float* G = s.G.data();
  for (int64_t i = 0; i < c; ++i) {
    const float* gi = At(g, t0 + i, h, H, K);
    for (int64_t x = 0; x < K; ++x) G[i * K + x] = (i ? G[(i - 1) * K + x] : 0.0f) + gi[x];
  }
  // A (strictly lower, scaled by beta_i) and P (lower with diagonal, scaled).
  for (int64_t i = 0; i < c; ++i) {
    const float* qi = At(q, t0 + i, h, H, K);
    const float* ki = At(k, t0 + i, h, H, K);
    const float bi = beta[(t0 + i) * H + h];
    for (int64_t j = 0; j <= i; ++j) {
      const float* kj = At(k, t0 + j, h, H, K);
      float a = 0.0f, p = 0.0f;
      for (int64_t x = 0; x < K; ++x) {
        const float e = std::exp(G[i * K + x] - G[j * K + x]);
        a += ki[x] * kj[x] * e;
        p += qi[x] * kj[x] * e;
      }
      s.A[i * c + j] = j < i ? bi * a : 0.0f;
      s.P[i * c + j] = scale * p;
    }
  }
  // T = (I + A)^-1 by forward substitution: T_ij = -sum_{j<=m<i} A_im T_mj.
  float* Tm = s.Tm.data();
  std::fill(s.Tm.begin(), s.Tm.end(), 0.0f);
  for (int64_t i = 0; i < c; ++i) {
    Tm[i * c + i] = 1.0f;
    for (int64_t j = 0; j < i; ++j) {
      float acc = 0.0f;
      for (int64_t m = j; m < i; ++m) acc += s.A[i * c + m] * Tm[m * c + j];
      Tm[i * c + j] = -acc;
    }
  }
  // W = T diag(beta) Khat, U = T diag(beta) V.
  std::fill(s.W.begin(), s.W.end(), 0.0f);
  std::fill(s.U.begin(), s.U.end(), 0.0f);
  for (int64_t i = 0; i < c; ++i) {
    float* wi = &s.W[i * K];
    float* ui = &s.U[i * V];
    for (int64_t j = 0; j <= i; ++j) {
      const float tb = Tm[i * c + j] * beta[(t0 + j) * H + h];
      const float* kj = At(k, t0 + j, h, H, K);
      const float* vj = At(v, t0 + j, h, H, V);
      for (int64_t x = 0; x < K; ++x) wi[x] += tb * kj[x] * std::exp(G[j * K + x]);
      for (int64_t y = 0; y < V; ++y) ui[y] += tb * vj[y];
    }
  }
  // u = U - W S_0 (in U).
  for (int64_t i = 0; i < c; ++i) {
    float* ui = &s.U[i * V];
    for (int64_t x = 0; x < K; ++x) {
      const float w = s.W[i * K + x];
      const float* srow = S + x * V;
      for (int64_t y = 0; y < V; ++y) ui[y] -= w * srow[y];
    }
  }
  // o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j.
  for (int64_t i = 0; i < c; ++i) {
    float* oi = o + ((t0 + i) * H + h) * V;
    const float* qi = At(q, t0 + i, h, H, K);
    std::fill(oi, oi + V, 0.0f);
    for (int64_t x = 0; x < K; ++x) {
      const float qh = scale * qi[x] * std::exp(G[i * K + x]);
      const float* srow = S + x * V;
      for (int64_t y = 0; y < V; ++y) oi[y] += qh * srow[y];
    }
    for (int64_t j = 0; j <= i; ++j) {
      const float p = s.P[i * c + j];
      const float* uj = &s.U[j * V];
      for (int64_t y = 0; y < V; ++y) oi[y] += p * uj[y];
    }
  }
  // S_c = diag(exp(G_c)) S_0 + sum_j (exp(G_c - G_j) k_j) u_j^T.
  const float* Gc = G + (c - 1) * K;
  for (int64_t x = 0; x < K; ++x) {
    float* srow = S + x * V;
    const float decay = std::exp(Gc[x]);
    for (int64_t y = 0; y < V; ++y) srow[y] *= decay;
    for (int64_t j = 0; j < c; ++j) {
      const float kd = At(k, t0 + j, h, H, K)[x] * std::exp(Gc[x] - G[j * K + x]);
      const float* uj = &s.U[j * V];
      for (int64_t y = 0; y < V; ++y) srow[y] += kd * uj[y];
    }
  }
}

}  // namespace

void KdaRecurrent(float* o, const float* q, const float* k, const float* v, const float* g,
                  const float* beta, float* state, const KdaDims& d, float scale) {
  ParallelFor(d.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      RecurrentHead(o, q, k, v, g, beta, state + h * d.K * d.V, d, h, scale);
    }
  });
}

void KdaChunk(float* o, const float* q, const float* k, const float* v, const float* g,
              const float* beta, float* state, const KdaDims& d, float scale, int64_t pos0,
              int chunk) {
  ParallelFor(d.H, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch scratch(chunk, d.K, d.V);
    for (int64_t h = begin; h < end; ++h) {
      float* S = state + h * d.K * d.V;
      int64_t t0 = 0;
      while (t0 < d.T) {
        const int64_t to_boundary = chunk - (pos0 + t0) % chunk;
        const int64_t c = std::min<int64_t>(to_boundary, d.T - t0);
        ChunkHead(o, q, k, v, g, beta, S, d, h, scale, t0, c, scratch);
        t0 += c;
      }
    }
  });
}

void KdaGate(float* g, const float* g_raw, int64_t T, int64_t H, int64_t K, const float* a_log,
             const float* dt_bias, std::optional<float> lower_bound) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float a = std::exp(a_log[h]);
      for (int64_t x = 0; x < K; ++x) {
        const int64_t i = (t * H + h) * K + x;
        const float z = g_raw[i] + dt_bias[h * K + x];
        if (lower_bound) {
          g[i] = *lower_bound * Sigmoid(a * z);
        } else {
          const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));
          g[i] = -a * softplus;
        }
      }
    }
  }
}

}  // namespace kimi::cpu
