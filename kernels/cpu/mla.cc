#include "kernels/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

// Cephes expf over an array (inputs <= 0 here), written to vectorise; see kda.cc.
KIMI_INLINE float ExpNonPositive(float x) {
  float v = x < -87.3365447505531f ? -87.3365447505531f : x;
  const float t = v * 1.44269504088896341f + 12582912.0f;
  const float f = t - 12582912.0f;
  int32_t ti;
  std::memcpy(&ti, &t, sizeof ti);
  const int32_t e = ti - 0x4b400000;  // in [-126, 0]
  float r = v - f * 0.693359375f;
  r = r - f * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (e + 127) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof s);
  return p * s;
}

constexpr int64_t kRows = 4;   // query rows per register tile
constexpr int64_t kKeys = 64;  // keys per block

// Per-thread state of the online softmax.
struct Scratch {
  std::vector<float> kt;  // [width, kKeys] keys of the block, transposed
  std::vector<const float*> key;
  Scratch(int64_t width) : kt(width * kKeys), key(kKeys) {}
};

// Rows [r0, r1) of the [T * heads] query rows over every visible key, key block by key block.
// For each row the keys are visited in ascending order with the same arithmetic whatever rows
// share its tile or thread, so a row's result depends only on its query and the cache.
KIMI_CLONES void AttendRows(float* out_lat, float* row_max, float* row_sum, const float* qa,
                            int64_t r0, int64_t r1, int64_t heads, int64_t first_pos,
                            const PagedRows& cache, int64_t rank, int64_t rope, float scale,
                            Scratch& s) {
  const int64_t width = rank + rope;
  const int64_t last_key = first_pos + (r1 - 1) / heads + 1;  // keys the last row sees
  for (int64_t r = r0; r < r1; ++r) {
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.0f;
    std::fill_n(out_lat + r * rank, rank, 0.0f);
  }
  for (int64_t s0 = 0; s0 < last_key; s0 += kKeys) {
    const int64_t nk = std::min(kKeys, last_key - s0);
    for (int64_t j = 0; j < nk; ++j) s.key[j] = cache.Row(s0 + j);
    float* kt = s.kt.data();
    for (int64_t d = 0; d < width; ++d) {
      for (int64_t j = 0; j < nk; ++j) kt[d * kKeys + j] = s.key[j][d];
      for (int64_t j = nk; j < kKeys; ++j) kt[d * kKeys + j] = 0.0f;
    }
    for (int64_t i0 = r0; i0 < r1; i0 += kRows) {
      const int64_t mr = std::min(kRows, r1 - i0);
      // Scores of kRows rows x kKeys keys (rows past r1 compute on a copy of the last row).
      float sc[kRows][kKeys] = {};
      const float* q[kRows];
      for (int64_t i = 0; i < kRows; ++i) q[i] = qa + (i0 + std::min(i, mr - 1)) * width;
      for (int64_t d = 0; d < width; ++d) {
        const float* k = kt + d * kKeys;
        for (int64_t i = 0; i < kRows; ++i) {
          const float qd = q[i][d];
          for (int64_t j = 0; j < kKeys; ++j) sc[i][j] += qd * k[j];
        }
      }
      for (int64_t i = 0; i < mr; ++i) {
        const int64_t r = i0 + i;
        const int64_t visible = std::min(nk, first_pos + r / heads + 1 - s0);  // keys of this block
        if (visible <= 0) continue;
        float mx = row_max[r];
        for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, sc[i][j] * scale);
        float p[kKeys];
        for (int64_t j = 0; j < kKeys; ++j) p[j] = ExpNonPositive(sc[i][j] * scale - mx);
        for (int64_t j = visible; j < kKeys; ++j) p[j] = 0.0f;
        const float corr = ExpNonPositive(row_max[r] - mx);  // 0 on the first block (-inf)
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) sum += p[j];
        row_sum[r] = row_sum[r] * corr + sum;
        row_max[r] = mx;
        float* o = out_lat + r * rank;
        for (int64_t c = 0; c < rank; ++c) o[c] *= corr;
        for (int64_t j = 0; j < visible; ++j) {
          const float pj = p[j];
          const float* key = s.key[j];
          for (int64_t c = 0; c < rank; ++c) o[c] += pj * key[c];
        }
      }
    }
  }
  for (int64_t r = r0; r < r1; ++r) {
    const float inv = 1.0f / row_sum[r];
    float* o = out_lat + r * rank;
    for (int64_t c = 0; c < rank; ++c) o[c] *= inv;
  }
}

}  // namespace

void MlaLatentAttention(float* out_lat, const float* qa, int64_t T, int64_t first_pos,
                        const PagedRows& cache, int64_t heads, int64_t rank, int64_t rope,
                        float scale) {
  const int64_t rows = T * heads;
  std::vector<float> row_max(rows), row_sum(rows);
  // A part gets at least 4 tiles of kRows rows, or half the rows when there are fewer: one
  // decode token's rows (one per head) are split too, though each part transposes the keys itself.
  ParallelFor(rows, std::max<int64_t>(1, std::min<int64_t>(4 * kRows, rows / 2)),
              [&](int64_t begin, int64_t end) {
                Scratch s(rank + rope);
                AttendRows(out_lat, row_max.data(), row_sum.data(), qa, begin, end, heads,
                           first_pos, cache, rank, rope, scale, s);
              });
}

void MlaAttention(float* out, const float* q, int64_t T, int64_t first_pos, const PagedRows& cache,
                  const Weight& w_kv_b, const MlaDims& d, float scale) {
  const int64_t qk = d.nope + d.rope, R = d.rank, width = R + d.rope;
  // Absorbed queries [T, heads, R + rope]: q_abs = W_UK_h^T q_nope, then q_pe.
  std::vector<float> qa(T * d.heads * width, 0.0f), w_uk(d.nope * R);
  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t row0 = h * (d.nope + d.v);
    for (int64_t n = 0; n < d.nope; ++n) DequantizeRow(&w_uk[n * R], w_kv_b, row0 + n);
    for (int64_t t = 0; t < T; ++t) {
      const float* qh = q + (t * d.heads + h) * qk;
      float* a = &qa[(t * d.heads + h) * width];
      for (int64_t n = 0; n < d.nope; ++n) {
        for (int64_t r = 0; r < R; ++r) a[r] += qh[n] * w_uk[n * R + r];
      }
      std::copy_n(qh + d.nope, d.rope, a + R);
    }
  }
  std::vector<float> o_lat(T * d.heads * R);
  MlaLatentAttention(o_lat.data(), qa.data(), T, first_pos, cache, d.heads, R, d.rope, scale);
  // o_h = W_UV_h o_lat for every query of each head.
  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t row0 = h * (d.nope + d.v);
    MatMul(out + h * d.v, d.heads * d.v, o_lat.data() + h * R, d.heads * R,
           w_kv_b.Rows(row0 + d.nope, d.v), T);
  }
}

}  // namespace kimi::cpu
