#include "kernels/cpu/attn_res.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

// (v . w, v . v) over H, in double: eight partial sums each (lane l takes i % 8 == l), added
// pairwise at the end, so the compiler vectorises the loop. A single running sum was a serial
// chain of dependent adds: about 2% of a batch-32 k3-mini step.
KIMI_CLONES void DotAndSquares(const float* v, const float* w, int64_t H, double* dot, double* sq) {
  constexpr int kLanes = 8;
  double d[kLanes] = {}, q[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= H; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double x = v[i + l];
      d[l] += x * w[i + l];
      q[l] += x * x;
    }
  }
  for (int l = 0; i < H; ++i, ++l) {
    const double x = v[i];
    d[l] += x * w[i];
    q[l] += x * x;
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) {
      d[l] += d[l + width];
      q[l] += q[l + width];
    }
  }
  *dot = d[0];
  *sq = q[0];
}

}  // namespace

void AttnRes(float* out, float* probs, const float* bank, int64_t bank_stride, int64_t nb,
             const float* partial, const float* w, int64_t T, int64_t H, float eps) {
  ParallelFor(T, 1, [&](int64_t begin, int64_t end) {
    // Per thread and kept: the engine calls this a token at a time (Residual::AddThenNormedInput),
    // so two heap blocks a call would be two a token and sublayer.
    thread_local std::vector<const float*> rows;
    thread_local std::vector<float> s;
    rows.resize(nb + 1);
    s.resize(nb + 1);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < nb; ++j) rows[j] = bank + t * bank_stride + j * H;
      rows[nb] = partial + t * H;
      float max_s = -INFINITY;
      for (int64_t j = 0; j <= nb; ++j) {
        double dot, sq;
        DotAndSquares(rows[j], w, H, &dot, &sq);
        s[j] = static_cast<float>(dot / std::sqrt(sq / static_cast<double>(H) + eps));
        max_s = std::max(max_s, s[j]);
      }
      double denom = 0.0;
      for (int64_t j = 0; j <= nb; ++j) {
        s[j] = std::exp(s[j] - max_s);
        denom += s[j];
      }
      for (int64_t j = 0; j <= nb; ++j) s[j] = static_cast<float>(s[j] / denom);
      float* o = out + t * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t j = 0; j <= nb; ++j) {
        for (int64_t i = 0; i < H; ++i) o[i] += s[j] * rows[j][i];
      }
      if (probs) std::copy(s.begin(), s.end(), probs + t * (nb + 1));
    }
  });
}

}  // namespace kimi::cpu
