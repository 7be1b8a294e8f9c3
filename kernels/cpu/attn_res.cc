#include "kernels/cpu/attn_res.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {

void AttnRes(float* out, float* probs, const float* bank, int64_t bank_stride, int64_t nb,
             const float* partial, const float* w, int64_t T, int64_t H, float eps) {
  ParallelFor(T, 1, [&](int64_t begin, int64_t end) {
    std::vector<const float*> rows(nb + 1);
    std::vector<float> s(nb + 1);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < nb; ++j) rows[j] = bank + t * bank_stride + j * H;
      rows[nb] = partial + t * H;
      float max_s = -INFINITY;
      for (int64_t j = 0; j <= nb; ++j) {
        double dot = 0.0, sq = 0.0;
        for (int64_t i = 0; i < H; ++i) {
          dot += static_cast<double>(rows[j][i]) * w[i];
          sq += static_cast<double>(rows[j][i]) * rows[j][i];
        }
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
