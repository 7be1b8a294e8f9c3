#include "kernels/cpu/moe_route.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {

namespace {

// The biased score an expert is ranked by: NaN ranks below every number, so that a NaN logit
// cannot take a place from a finite one (and the ranking stays a strict weak order).
float RankKey(float biased) { return std::isnan(biased) ? -INFINITY : biased; }

// The k best of the selectable experts, best first, ties to the lower id: one pass keeping a
// sorted list of k (an expert equal to the list's last never displaces it, as its id is higher).
// At E = 64 and k = 8 this and the scores take about a quarter of what a stable partition and a
// partial sort of every expert did.
template <class Selectable>
void TopK(const float* key, int64_t E, int64_t k, const Selectable& selectable, int32_t* best) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float v = key[e];
    if ((n == k && !(v > key[best[k - 1]])) || !selectable(e)) continue;
    int64_t pos = n < k ? n++ : k - 1;
    for (; pos > 0 && v > key[best[pos - 1]]; --pos) best[pos] = best[pos - 1];
    best[pos] = static_cast<int32_t>(e);
  }
}

// Tokens [t0, t1).
void RouteTokens(int32_t* ids, float* weights, const float* logits, const float* bias, int64_t t0,
                 int64_t t1, const MoeRouteParams& p) {
  const int64_t E = p.num_experts, k = p.top_k;
  const int64_t per_group = E / p.num_groups;
  std::vector<float> score(E), key(E);
  std::vector<int32_t> group_order(p.num_groups);
  std::vector<float> group_score(p.num_groups);
  std::vector<char> group_kept(p.num_groups);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      score[e] = Sigmoid(logits[t * E + e]);
      key[e] = RankKey(score[e] + (bias ? bias[e] : 0.0f));
    }
    // Group stage: a group's score is the sum of its two best biased scores.
    if (p.num_groups > 1) {
      for (int64_t gi = 0; gi < p.num_groups; ++gi) {
        const float* b = &key[gi * per_group];
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
      const auto in_kept_group = [&](int64_t e) { return group_kept[e / per_group] != 0; };
      TopK(key.data(), E, k, in_kept_group, ids + t * k);
    } else {
      const auto any = [](int64_t) { return true; };
      TopK(key.data(), E, k, any, ids + t * k);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      weights[t * k + j] = score[ids[t * k + j]];
      sum += weights[t * k + j];
    }
    for (int64_t j = 0; j < k; ++j) {
      float& w = weights[t * k + j];
      if (p.renormalize) w /= sum + 1e-20f;
      w *= p.scaling;
    }
  }
}

}  // namespace

void MoeRoute(int32_t* ids, float* weights, const float* logits, const float* bias, int64_t T,
              const MoeRouteParams& p) {
  // Tokens are independent: a part of them per thread (a token is 0.4-2.5 us at E = 64-384).
  ParallelFor(T, 4,
              [&](int64_t t0, int64_t t1) { RouteTokens(ids, weights, logits, bias, t0, t1, p); });
}

}  // namespace kimi::cpu
