#include "kernels/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {

void MlaAttention(float* out, const float* q, int64_t T, int64_t first_pos, const PagedRows& cache,
                  const Weight& w_kv_b, const MlaDims& d, float scale) {
  const int64_t qk = d.nope + d.rope;
  const int64_t R = d.rank;
  const int64_t keys = first_pos + T;
  ParallelFor(d.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w_uk(d.nope * R);  // W_UK_h as fp32 [nope, rank]
    std::vector<float> q_abs(R), probs(keys), o_lat(T * R);
    for (int64_t h = begin; h < end; ++h) {
      const int64_t row0 = h * (d.nope + d.v);
      for (int64_t n = 0; n < d.nope; ++n) DequantizeRow(&w_uk[n * R], w_kv_b, row0 + n);
      for (int64_t t = 0; t < T; ++t) {
        const float* qh = q + (t * d.heads + h) * qk;
        // Absorb W_UK into the query: q_abs = W_UK_h^T q_nope.
        std::fill(q_abs.begin(), q_abs.end(), 0.0f);
        for (int64_t n = 0; n < d.nope; ++n) {
          const float qn = qh[n];
          const float* wr = &w_uk[n * R];
          for (int64_t r = 0; r < R; ++r) q_abs[r] += qn * wr[r];
        }
        const int64_t visible = first_pos + t + 1;
        float max_score = -INFINITY;
        for (int64_t s = 0; s < visible; ++s) {
          const float* row = cache.Row(s);
          float acc = 0.0f;
          for (int64_t r = 0; r < R; ++r) acc += q_abs[r] * row[r];
          for (int64_t e = 0; e < d.rope; ++e) acc += qh[d.nope + e] * row[R + e];
          probs[s] = acc * scale;
          max_score = std::max(max_score, probs[s]);
        }
        double denom = 0.0;
        for (int64_t s = 0; s < visible; ++s) {
          probs[s] = std::exp(probs[s] - max_score);
          denom += probs[s];
        }
        const float inv = static_cast<float>(1.0 / denom);
        float* ol = &o_lat[t * R];
        std::fill(ol, ol + R, 0.0f);
        for (int64_t s = 0; s < visible; ++s) {
          const float p = probs[s] * inv;
          const float* row = cache.Row(s);
          for (int64_t r = 0; r < R; ++r) ol[r] += p * row[r];
        }
      }
      // o_h = W_UV_h o_lat for every query of this head.
      MatMul(out + h * d.v, d.heads * d.v, o_lat.data(), R, w_kv_b.Rows(row0 + d.nope, d.v), T);
    }
  });
}

}  // namespace kimi::cpu
