// Sizing a model from its config alone: tensors, parameters, bytes, per-request state, KV per
// token, AttnRes cache, and (with a parallel layout) what each rank holds and moves.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model_config.h"

namespace kimi {

struct ModelPlan {
  int64_t tensors = 0;
  int64_t parameters = 0;
  int64_t active_parameters = 0;  // per token: top-k routed experts, embedding lookup excluded
  int64_t weight_bytes = 0;       // as published: bf16, MXFP4 experts packed
  int64_t active_weight_bytes = 0;
  int64_t kda_state_bytes = 0;    // per request: recurrent + conv, all KDA layers, fp32
  int64_t kv_bytes_per_token = 0; // MLA latent cache, all MLA layers, fp32
  int64_t attn_res_bytes_per_token = 0;  // AttnRes bank per token in flight, fp32
  int64_t kda_layers = 0, mla_layers = 0, moe_layers = 0;
};

ModelPlan PlanModel(const ModelConfig& config);

}  // namespace kimi
