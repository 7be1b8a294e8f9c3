// Sizing a model from its config alone: tensors, parameters, bytes, per-request state, KV per
// token, AttnRes cache, and (with a parallel layout) what each rank holds and moves.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model_config.h"
#include "engine/parallel.h"

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

// What the heaviest rank of a layout holds and moves (bytes; fp32 state and activations, weights
// as published). Traffic counts the bytes a rank sends per decode token (ring all-reduce and
// all-gather move 2(G-1)/G and (G-1)/G of the message per rank).
struct ParallelPlan {
  ParallelLayout layout;
  int ranks = 1;
  int64_t weight_bytes_per_rank = 0;       // max over ranks
  int64_t kda_state_bytes_per_rank = 0;    // per request
  int64_t kv_bytes_per_token_per_rank = 0;
  int64_t attn_res_bytes_per_token = 0;    // per token in flight, on each rank of a stage
  int64_t context = 0;
  int64_t request_bytes_per_rank = 0;      // KDA state + KV at `context`
  // Per decode token, per rank:
  int64_t tp_bytes = 0;        // all-reduces of attention outputs and dense MLPs
  int64_t ep_bytes = 0;        // routed-expert combine (all-reduce in the latent)
  int64_t pp_bytes = 0;        // hidden state + AttnRes bank across one stage boundary
  int64_t vocab_bytes = 0;     // logits all-gather on the last stage
  // Expert dispatch with tokens spread over the ranks (all-to-all, DeepEP style): bytes per token
  // each way, in the expert width actually dispatched, and what the full hidden would cost.
  int64_t dispatch_bytes_per_token = 0;
  int64_t dispatch_bytes_full_hidden = 0;
};

ParallelPlan PlanParallel(const ModelConfig& config, const ParallelLayout& layout,
                          int64_t context);

}  // namespace kimi
