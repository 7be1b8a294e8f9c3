#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

// Row pointers into token-major [T, H, X] tensors.
inline const float* At(const float* base, int64_t t, int64_t h, int64_t H, int64_t X) {
  return base + (t * H + h) * X;
}

// exp over an array, written so that the compiler vectorises it (Cephes expf: ~1 ulp on
// [-87.3, 88.4], inputs clamped to that range). 2^e is applied as two factors, so e = 128 (inputs
// near the top of the range) does not overflow the exponent field.
KIMI_INLINE void ExpArray(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] < -87.3365447505531f ? -87.3365447505531f : x[i];
    v = v > 88.3762626647949f ? 88.3762626647949f : v;
    int32_t e;
    const float p = ExpPoly(v, &e);
    const int32_t h = e >> 1;
    const int32_t b1 = (h + 127) << 23, b2 = (e - h + 127) << 23;
    float s1, s2;
    std::memcpy(&s1, &b1, sizeof s1);
    std::memcpy(&s2, &b2, sizeof s2);
    out[i] = p * s1 * s2;
  }
}

// Token t's rows of head h in the recurrence's inputs.
struct TokenRows {
  const float *q, *k, *v, *g;
  float beta;
  TokenRows(const float* q_, const float* k_, const float* v_, const float* g_, const float* beta_,
            int64_t t, int64_t h, int64_t H, int64_t K, int64_t V)
      : q(At(q_, t, h, H, K)),
        k(At(k_, t, h, H, K)),
        v(At(v_, t, h, H, V)),
        g(At(g_, t, h, H, K)),
        beta(beta_[t * H + h]) {}
};

// 16 floats as one value: a 512-bit register in the x86-64-v4 clone, pairs or quads of narrower
// ones in the others. Every function taking or returning one is inlined into a clone, so the ABI
// note GCC gives for the default target does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Vec16 __attribute__((vector_size(64)));
KIMI_INLINE Vec16 LoadVec16(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
KIMI_INLINE void StoreVec16(float* p, Vec16 v) { std::memcpy(p, &v, sizeof v); }

// RecurrentHead for K = V = 128 (every Kimi checkpoint's head_dim): kv, u and out live in
// registers across the rows of S, where the general loop loads and stores them once per row (twice
// the memory operations of the state itself). The same operations on every element, in the same
// order, so the same bits as the general loop. Both take exp(g) of a token's row in one vectorised
// pass (ExpArray) before the rows: a libm call per row, between the row's loads and stores, made
// this loop save and restore its accumulators around every call.
template <int V>
KIMI_INLINE void RecurrentHeadFixed(float* o, const float* q, const float* k, const float* v,
                                    const float* g, const float* beta, float* S, const KdaDims& d,
                                    int64_t h, float scale) {
  constexpr int kN = V / 16;
  constexpr int64_t K = V;
  const int64_t H = d.H;
  float decay[K];
  for (int64_t t = 0; t < d.T; ++t) {
    const TokenRows in(q, k, v, g, beta, t, h, H, K, V);
    const float *qt = in.q, *kt = in.k, *vt = in.v;
    ExpArray(decay, in.g, K);
    const float bt = in.beta;
    Vec16 kv[kN] = {};
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = kt[i];
#pragma GCC unroll 8
      for (int c = 0; c < kN; ++c) {
        const Vec16 r = LoadVec16(row + 16 * c) * decay[i];
        StoreVec16(row + 16 * c, r);
        kv[c] += r * ki;
      }
    }
    Vec16 u[kN], out[kN] = {};
#pragma GCC unroll 8
    for (int c = 0; c < kN; ++c) u[c] = bt * (LoadVec16(vt + 16 * c) - kv[c]);
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = kt[i];
      const float qi = qt[i] * scale;
#pragma GCC unroll 8
      for (int c = 0; c < kN; ++c) {
        const Vec16 r = LoadVec16(row + 16 * c) + ki * u[c];
        StoreVec16(row + 16 * c, r);
        out[c] += r * qi;
      }
    }
    float* ot = o + (t * H + h) * V;
#pragma GCC unroll 8
    for (int c = 0; c < kN; ++c) StoreVec16(ot + 16 * c, out[c]);
  }
}
#pragma GCC diagnostic pop

KIMI_CLONES void RecurrentHead(float* o, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* S, const KdaDims& d, int64_t h, float scale) {
  if (d.K == 128 && d.V == 128) return RecurrentHeadFixed<128>(o, q, k, v, g, beta, S, d, h, scale);
  const int64_t K = d.K, V = d.V, H = d.H;
  std::vector<float> kv(V), u(V), out(V), decay(K);
  for (int64_t t = 0; t < d.T; ++t) {
    const TokenRows in(q, k, v, g, beta, t, h, H, K, V);
    const float *qt = in.q, *kt = in.k, *vt = in.v;
    ExpArray(decay.data(), in.g, K);
    const float bt = in.beta;
    // S = diag(exp(g)) S, and kv = S^T k on the decayed state, in one pass.
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = kt[i];
      for (int64_t j = 0; j < V; ++j) {
        row[j] *= decay[i];
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

// y[0, n) += a * x[0, n)
KIMI_INLINE void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// 16 independent lanes, then a fixed pairwise sum (vectorises without -ffast-math).
KIMI_INLINE float Dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  for (int w = 8; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

// C[i, n] += sum_{m < kd(i)} A(i, m) B[m, n] for i < M, n < N; A(i, m) = A[i * ars + m * acs],
// B and C row-major. kd(i) = Kd, or min(Kd, i + 1) when `lower` (A lower triangular). Register
// tiles of 4 rows x 64 columns; the sum over m runs in ascending order for every element.
KIMI_INLINE void GemmAcc(float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs,
                         const float* B, int64_t ldb, int64_t M, int64_t N, int64_t Kd,
                         bool lower = false) {
  constexpr int64_t kR = 4, kC = 64;
  for (int64_t i0 = 0; i0 < M; i0 += kR) {
    const int64_t mr = std::min(kR, M - i0);
    const int64_t kd = lower ? std::min(Kd, i0 + mr) : Kd;
    for (int64_t n0 = 0; n0 < N; n0 += kC) {
      const int64_t nr = std::min(kC, N - n0);
      if (mr == kR && nr == kC) {
        float acc[kR][kC];
        for (int64_t r = 0; r < kR; ++r) {
          for (int64_t n = 0; n < kC; ++n) acc[r][n] = C[(i0 + r) * ldc + n0 + n];
        }
        for (int64_t m = 0; m < kd; ++m) {
          const float* b = B + m * ldb + n0;
          const float* a = A + i0 * ars + m * acs;
          for (int64_t r = 0; r < kR; ++r) {
            // In a lower-triangular A, rows i < m contribute zeros: skipping them keeps the
            // per-element order (ascending m) and the result.
            const float ar = a[r * ars];
            for (int64_t n = 0; n < kC; ++n) acc[r][n] += ar * b[n];
          }
        }
        for (int64_t r = 0; r < kR; ++r) {
          for (int64_t n = 0; n < kC; ++n) C[(i0 + r) * ldc + n0 + n] = acc[r][n];
        }
        continue;
      }
      for (int64_t r = 0; r < mr; ++r) {
        const int64_t kdr = lower ? std::min(Kd, i0 + r + 1) : Kd;
        float* c = C + (i0 + r) * ldc + n0;
        for (int64_t m = 0; m < kdr; ++m) Axpy(c, A[(i0 + r) * ars + m * acs], B + m * ldb + n0, nr);
      }
    }
  }
}

constexpr int64_t kSub = 16;  // sub-chunk: pairwise exps only inside these diagonal blocks

// Scratch for one chunk of one head; every matrix is row-major [c, width].
struct ChunkScratch {
  std::vector<float> Q, Kc, Vc, beta, G, A, P, Tm, W, U, left_k, left_q, L, ex, Khat, Qhat, Kd, decay;
  ChunkScratch(int64_t c, int64_t K, int64_t V)
      : Q(c * K), Kc(c * K), Vc(c * V), beta(c), G(c * K), A(c * c), P(c * c), Tm(c * c),
        W(c * K), U(c * V), left_k(c * K), left_q(c * K), L(c * K), ex(c * K), Khat(c * K),
        Qhat(c * K), Kd(c * K), decay(K) {}
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
//
// The c^2 K pairwise exps of A and P are factorised over sub-chunks of kSub tokens: for i in the
// sub-chunk starting at s and j < s, exp(G_i - G_j) = exp(G_i - G_s) exp(G_s - G_j), both factors
// <= 1 (g <= 0), so the off-diagonal blocks are plain matrix products of rescaled q, k; only the
// diagonal blocks take pairwise exps. Every exponent is of a non-positive number: nothing overflows.
KIMI_CLONES void ChunkHead(float* o, const float* q, const float* k, const float* v,
                           const float* g, const float* beta, float* S, const KdaDims& d,
                           int64_t h, float scale, int64_t t0, int64_t c, ChunkScratch& s) {
  const int64_t K = d.K, V = d.V, H = d.H;
  float *Q = s.Q.data(), *Kc = s.Kc.data(), *Vc = s.Vc.data(), *G = s.G.data();
  float *A = s.A.data(), *P = s.P.data(), *Tm = s.Tm.data(), *W = s.W.data(), *U = s.U.data();
  float* ex = s.ex.data();
  for (int64_t i = 0; i < c; ++i) {
    const float* gi = At(g, t0 + i, h, H, K);
    std::copy_n(At(q, t0 + i, h, H, K), K, Q + i * K);
    std::copy_n(At(k, t0 + i, h, H, K), K, Kc + i * K);
    std::copy_n(At(v, t0 + i, h, H, V), V, Vc + i * V);
    s.beta[i] = beta[(t0 + i) * H + h];
    for (int64_t x = 0; x < K; ++x) G[i * K + x] = (i ? G[(i - 1) * K + x] : 0.0f) + gi[x];
  }
  // A (strictly lower, rows scaled by beta_i) and P (lower with diagonal, scaled).
  std::fill_n(A, c * c, 0.0f);
  std::fill_n(P, c * c, 0.0f);
  for (int64_t s0 = 0; s0 < c; s0 += kSub) {
    const int64_t s1 = std::min(s0 + kSub, c);
    const float* Gs = G + s0 * K;
    // Diagonal block: pairwise exps.
    for (int64_t i = s0; i < s1; ++i) {
      for (int64_t j = s0; j <= i; ++j) {
        for (int64_t x = 0; x < K; ++x) ex[j * K + x] = G[i * K + x] - G[j * K + x];
      }
      ExpArray(ex + s0 * K, ex + s0 * K, (i - s0 + 1) * K);
      for (int64_t j = s0; j <= i; ++j) {
        float* e = ex + j * K;
        float a[16] = {}, p[16] = {};
        for (int64_t x0 = 0; x0 < K; x0 += 16) {
          const int64_t n = std::min<int64_t>(16, K - x0);
          for (int64_t l = 0; l < n; ++l) {
            const float kj = Kc[j * K + x0 + l] * e[x0 + l];
            a[l] += Kc[i * K + x0 + l] * kj;
            p[l] += Q[i * K + x0 + l] * kj;
          }
        }
        for (int w = 8; w > 0; w /= 2) {
          for (int l = 0; l < w; ++l) {
            a[l] += a[l + w];
            p[l] += p[l + w];
          }
        }
        if (j < i) A[i * c + j] = s.beta[i] * a[0];
        P[i * c + j] = scale * p[0];
      }
    }
    if (s0 == 0) continue;
    // Off-diagonal blocks (j < s0): left factors exp(G_i - G_s), right factors exp(G_s - G_j).
    float *lk = s.left_k.data(), *lq = s.left_q.data(), *L = s.L.data();
    for (int64_t i = s0; i < s1; ++i) {
      for (int64_t x = 0; x < K; ++x) ex[i * K + x] = G[i * K + x] - Gs[x];
    }
    ExpArray(ex + s0 * K, ex + s0 * K, (s1 - s0) * K);
    for (int64_t i = s0; i < s1; ++i) {
      for (int64_t x = 0; x < K; ++x) {
        lk[i * K + x] = Kc[i * K + x] * ex[i * K + x];
        lq[i * K + x] = Q[i * K + x] * ex[i * K + x];
      }
    }
    for (int64_t j = 0; j < s0; ++j) {
      for (int64_t x = 0; x < K; ++x) ex[j * K + x] = Gs[x] - G[j * K + x];
    }
    ExpArray(ex, ex, s0 * K);
    for (int64_t j = 0; j < s0 * K; ++j) L[j] = Kc[j] * ex[j];
    for (int64_t i = s0; i < s1; ++i) {
      for (int64_t j = 0; j < s0; ++j) {
        A[i * c + j] = s.beta[i] * Dot(lk + i * K, L + j * K, K);
        P[i * c + j] = scale * Dot(lq + i * K, L + j * K, K);
      }
    }
  }
  // T = (I + A)^-1 by forward substitution, a row at a time: T_i = e_i - sum_{m<i} A_im T_m.
  std::fill_n(Tm, c * c, 0.0f);
  for (int64_t i = 0; i < c; ++i) {
    float* ti = Tm + i * c;
    for (int64_t m = 0; m < i; ++m) Axpy(ti, -A[i * c + m], Tm + m * c, m + 1);
    ti[i] = 1.0f;
  }
  // W = T diag(beta) Khat, U = T diag(beta) V (T lower triangular; B = T diag(beta) in Tm).
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) Tm[i * c + j] *= s.beta[j];
  }
  float* Khat = s.Khat.data();
  ExpArray(ex, G, c * K);
  for (int64_t j = 0; j < c * K; ++j) Khat[j] = Kc[j] * ex[j];
  std::fill_n(W, c * K, 0.0f);
  std::fill_n(U, c * V, 0.0f);
  GemmAcc(W, K, Tm, c, 1, Khat, K, c, K, c, /*lower=*/true);
  GemmAcc(U, V, Tm, c, 1, Vc, V, c, V, c, /*lower=*/true);
  // u = U - W S_0 (in U).
  for (int64_t j = 0; j < c * K; ++j) W[j] = -W[j];
  GemmAcc(U, V, W, K, 1, S, V, c, V, K);
  // o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j, with Qhat = scale exp(G) q (exp(G) still in ex).
  float* Qhat = s.Qhat.data();
  for (int64_t j = 0; j < c * K; ++j) Qhat[j] = scale * Q[j] * ex[j];
  float* oc = o + (t0 * H + h) * V;  // row i of this head's output: oc + i * H * V
  for (int64_t i = 0; i < c; ++i) std::fill_n(oc + i * H * V, V, 0.0f);
  GemmAcc(oc, H * V, Qhat, K, 1, S, V, c, V, K);
  GemmAcc(oc, H * V, P, c, 1, U, V, c, V, c, /*lower=*/true);
  // S_c = diag(exp(G_c)) S_0 + sum_j (exp(G_c - G_j) k_j) u_j^T.
  const float* Gc = G + (c - 1) * K;
  float *Kd = s.Kd.data(), *decay = s.decay.data();
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t x = 0; x < K; ++x) ex[j * K + x] = Gc[x] - G[j * K + x];
  }
  ExpArray(ex, ex, c * K);
  for (int64_t j = 0; j < c * K; ++j) Kd[j] = Kc[j] * ex[j];
  ExpArray(decay, Gc, K);
  for (int64_t x = 0; x < K; ++x) {
    for (int64_t y = 0; y < V; ++y) S[x * V + y] *= decay[x];
  }
  GemmAcc(S, V, Kd, 1, K, U, V, K, V, c);  // A(x, j) = Kd[j, x]
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
  // Over the threads by (token, head): an exp per element, about 2% of a batch-64 step serially.
  ParallelFor(T * H, std::max<int64_t>(1, 1024 / std::max<int64_t>(K, 1)),
              [&](int64_t begin, int64_t end) {
                if (lower_bound) {
                  // K3: the sigmoid through the vectorised activation (SigmoidInPlace, the same
                  // result wherever an element sits); with libm's expf one element at a time it
                  // took 1.5 ns an element on two threads, about 1.4% of a 512-token prefill.
                  for (int64_t th = begin; th < end; ++th) {
                    const int64_t h = th % H;
                    const float a = std::exp(a_log[h]);
                    for (int64_t x = 0; x < K; ++x) {
                      g[th * K + x] = a * (g_raw[th * K + x] + dt_bias[h * K + x]);
                    }
                  }
                  float* part = g + begin * K;
                  const int64_t n = (end - begin) * K;
                  SigmoidInPlace(part, n);
                  for (int64_t i = 0; i < n; ++i) part[i] *= *lower_bound;
                  return;
                }
                for (int64_t th = begin; th < end; ++th) {
                  const int64_t h = th % H;
                  const float a = std::exp(a_log[h]);
                  for (int64_t x = 0; x < K; ++x) {
                    const int64_t i = th * K + x;
                    const float z = g_raw[i] + dt_bias[h * K + x];
                    const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));
                    g[i] = -a * softplus;
                  }
                }
              });
}

}  // namespace kimi::cpu
