// The FFN sublayers on their own, for tools and tests that check one sublayer against an outside
// reference (kimi-ops latent_moe). x: [rows, hidden] (already normalised), out: [rows, hidden].
#pragma once

#include <cstdint>

#include "engine/model_config.h"
#include "engine/weights.h"

namespace kimi {

void RunGatedMlp(const ModelConfig& config, const MlpWeights& w, const float* x, float* out,
                 int64_t rows);
void RunMoe(const ModelConfig& config, const MoeWeights& w, const float* x, float* out,
            int64_t rows);

}  // namespace kimi
