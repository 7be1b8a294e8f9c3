// A model config and a fake engine step for scheduler tests that need no weights: the pools are
// real, the logits are a deterministic function of the sequence's position.
#pragma once

#include <vector>

#include "engine/engine.h"
#include "scheduler/scheduler.h"

namespace kimi::sched::testing {

inline ModelConfig FakeConfig(int64_t vocab = 32) {
  ModelConfig c;
  c.hidden = 8;
  c.num_layers = 2;
  c.vocab = vocab;
  c.max_context = 4096;
  c.layer_kinds = {LayerKind::kKda, LayerKind::kMla};
  c.kda = {1, 4, 4, false, std::nullopt};
  c.mla.num_heads = 1;
  c.mla.kv_lora_rank = 4;
  c.mla.qk_nope_head_dim = 2;
  c.mla.qk_rope_head_dim = 2;
  c.mla.v_head_dim = 2;
  return c;
}

// Logits whose argmax is the index of the position being predicted (mod vocab).
inline StepOutput FakeStep(const StepPlan& plan, int64_t vocab) {
  StepOutput out;
  out.vocab = vocab;
  for (const SequenceStep& s : plan.batch) {
    if (s.logits == LogitsWanted::kNone) {
      out.first_row.push_back(-1);
      continue;
    }
    out.first_row.push_back(static_cast<int64_t>(out.logits.size()) / vocab);
    const int64_t pos = s.pos0 + static_cast<int64_t>(s.tokens.size());
    for (int64_t v = 0; v < vocab; ++v) out.logits.push_back(v == pos % vocab ? 5.0f : 0.0f);
  }
  return out;
}

}  // namespace kimi::sched::testing
