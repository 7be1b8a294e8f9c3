#include "kernels/cpu/moe_route.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/activation.h"

namespace kimi::cpu {

void MoeRoute(int32_t* ids, float* weights, const float* logits, const float* bias, int64_t T,
              const MoeRouteParams& p) {
  const int64_t E = p.num_experts;
  const int64_t per_group = E / p.num_groups;
  std::vector<float> score(E), biased(E);
  std::vector<int32_t> order(E), group_order(p.num_groups);
  std::vector<float> group_score(p.num_groups);
  std::vector<char> group_kept(p.num_groups);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      score[e] = Sigmoid(logits[t * E + e]);
      biased[e] = score[e] + (bias ? bias[e] : 0.0f);
    }
    // Group stage: a group's score is the sum of its two best biased scores.
    if (p.num_groups > 1) {
      for (int64_t gi = 0; gi < p.num_groups; ++gi) {
        const float* b = &biased[gi * per_group];
        float best = -INFINITY, second = -INFINITY;
        for (int64_t j = 0; j < per_group; ++j) {
          if (b[j] > best) {
            second = best;
            best = b[j];
          } else if (b[j] > second) {
            second = b[j];
          }
        }
        group_score[gi] = per_group > 1 ? best + second : best;
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::stable_sort(group_order.begin(), group_order.end(),
                       [&](int32_t a, int32_t b) { return group_score[a] > group_score[b]; });
      std::fill(group_kept.begin(), group_kept.end(), 0);
      for (int64_t gi = 0; gi < p.topk_groups; ++gi) group_kept[group_order[gi]] = 1;
    }
    std::iota(order.begin(), order.end(), 0);
    auto selectable = [&](int32_t e) { return p.num_groups <= 1 || group_kept[e / per_group]; };
    // Partition the selectable experts first, then take the k best (stable: lower id wins ties).
    auto mid = std::stable_partition(order.begin(), order.end(), selectable);
    std::partial_sort(order.begin(), order.begin() + p.top_k, mid, [&](int32_t a, int32_t b) {
      return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
    });
    float sum = 0.0f;
    for (int64_t j = 0; j < p.top_k; ++j) {
      ids[t * p.top_k + j] = order[j];
      weights[t * p.top_k + j] = score[order[j]];
      sum += score[order[j]];
    }
    for (int64_t j = 0; j < p.top_k; ++j) {
      float& w = weights[t * p.top_k + j];
      if (p.renormalize) w /= sum + 1e-20f;
      w *= p.scaling;
    }
  }
}

}  // namespace kimi::cpu
