// Mixture-of-experts routing as DeepSeek-V3 / Kimi do it ("noaux_tc"): sigmoid scores in fp32, a
// per-expert correction bias added for selection only, grouped top-k, weights from the unbiased
// scores, renormalised and scaled.
#pragma once

#include <cstdint>

namespace kimi::cpu {

struct MoeRouteParams {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t num_groups = 1;  // experts split into equal groups; only `topk_groups` best groups kept
  int64_t topk_groups = 1;
  bool renormalize = true;
  float scaling = 1.0f;  // routed_scaling_factor
};

// logits [T, E] (fp32), bias [E] or null. ids [T, k] best first (ties: lower id first),
// weights [T, k].
void MoeRoute(int32_t* ids, float* weights, const float* logits, const float* bias, int64_t T,
              const MoeRouteParams& p);

}  // namespace kimi::cpu
