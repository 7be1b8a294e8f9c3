#include "engine/plan.h"

#include <algorithm>

#include "engine/state.h"
#include "engine/tensor_set.h"

namespace kimi {

ModelPlan PlanModel(const ModelConfig& c) {
  ModelPlan p;
  const double active_share =
      c.moe.num_experts > 0 ? static_cast<double>(c.moe.top_k) / c.moe.num_experts : 0.0;
  int64_t routed_params = 0, routed_bytes = 0;
  for (const TensorSpec& s : ExpectedTensors(c)) {
    ++p.tensors;
    p.parameters += s.parameters;
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    const int64_t bytes = s.role == TensorRole::kFloat ? numel * 2 : numel;
    p.weight_bytes += bytes;
    if (s.group == TensorGroup::kRoutedExpert) {
      routed_params += s.parameters;
      routed_bytes += bytes;
      continue;
    }
    if (s.group == TensorGroup::kEmbedding) {
      p.active_weight_bytes += c.hidden * 2;  // one row is read
      continue;
    }
    p.active_parameters += s.parameters;
    p.active_weight_bytes += bytes;
  }
  p.active_parameters += static_cast<int64_t>(routed_params * active_share + 0.5);
  p.active_weight_bytes += static_cast<int64_t>(routed_bytes * active_share + 0.5);
  p.kda_state_bytes = KdaStatePool::SlotBytes(c);
  p.kv_bytes_per_token = MlaKvCache::BytesPerToken(c);
  p.attn_res_bytes_per_token = AttnResCacheBytes(c, 1);
  p.kda_layers = c.NumLayersOf(LayerKind::kKda);
  p.mla_layers = c.NumLayersOf(LayerKind::kMla);
  for (int64_t l = 0; l < c.num_layers; ++l) p.moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  return p;
}

namespace {

// Bytes of one tensor held by rank `s` of the layout.
int64_t ShardBytes(const ModelConfig& c, const TensorSpec& t, const Shard& s) {
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  const int64_t bytes = t.role == TensorRole::kFloat ? numel * 2 : numel;
  if (t.layer >= 0 && !s.HasLayer(t.layer)) return 0;
  const int g = s.layout.group(), tp = s.tp_size(), ep = s.ep_size();
  switch (t.group) {
    case TensorGroup::kEmbedding:
      return s.first_stage() ? bytes : 0;
    case TensorGroup::kLmHead:
      return s.last_stage() ? (bytes + g - 1) / g : 0;
    case TensorGroup::kKda:
      // f_a / g_a (the low-rank entries) are replicated; the rest split by heads.
      if (t.shape[0] == c.kda.head_dim && t.name.find("_a_proj") != std::string::npos) {
        return bytes;
      }
      return bytes / tp;
    case TensorGroup::kMla:
      if (t.name.find("q_a_proj") != std::string::npos ||
          t.name.find("kv_a_proj") != std::string::npos) {
        return bytes;
      }
      return bytes / tp;
    case TensorGroup::kDenseMlp:
      return bytes / tp;
    case TensorGroup::kSharedExpert:
      return ep > 1 ? bytes : bytes / tp;
    case TensorGroup::kRoutedExpert:
      if (ep > 1) {
        const int64_t per = c.moe.num_experts / ep;
        return t.expert / per == s.ep_rank() ? bytes : 0;
      }
      return bytes / tp;
    case TensorGroup::kNorm:
      if (t.layer < 0 && !s.last_stage()) return 0;  // final norm lives with lm_head
      return bytes;
    case TensorGroup::kRouter:
    case TensorGroup::kLatentProj:
    case TensorGroup::kAttnRes:
      if (t.layer < 0 && !s.last_stage()) return 0;
      return bytes;
  }
  return bytes;
}

// A ring all-reduce sends 2(G-1)/G of the message per rank; an all-gather (G-1)/G of the whole.
int64_t AllReduceBytes(int64_t message, int g) { return g > 1 ? 2 * (g - 1) * message / g : 0; }

}  // namespace

ParallelPlan PlanParallel(const ModelConfig& c, const ParallelLayout& layout, int64_t context) {
  ParallelPlan p;
  p.layout = layout;
  p.ranks = layout.world();
  p.context = context;
  const std::vector<TensorSpec> specs = ExpectedTensors(c);
  const int g = layout.group();
  for (int r = 0; r < p.ranks; ++r) {
    const Shard s = Shard::For(c, layout, r);
    int64_t w = 0;
    for (const TensorSpec& t : specs) w += ShardBytes(c, t, s);
    p.weight_bytes_per_rank = std::max(p.weight_bytes_per_rank, w);
    const ModelConfig sc = ShardConfig(c, s);
    p.kda_state_bytes_per_rank = std::max(p.kda_state_bytes_per_rank, KdaStatePool::SlotBytes(sc));
    p.kv_bytes_per_token_per_rank =
        std::max(p.kv_bytes_per_token_per_rank, MlaKvCache::BytesPerToken(sc));
    // Traffic of this rank's stage, per decode token.
    int64_t tp = 0, ep = 0;
    for (int64_t l = s.first_layer; l < s.end_layer; ++l) {
      if (layout.tp > 1) {
        tp += AllReduceBytes(c.hidden * 4, g);                       // attention output
        if (!c.IsMoeLayer(l)) tp += AllReduceBytes(c.hidden * 4, g);  // dense MLP
      }
      if (c.IsMoeLayer(l) && (layout.tp > 1 || layout.ep > 1)) {
        ep += AllReduceBytes(c.ExpertDim() * 4, g);  // routed sum, in the latent
        if (layout.tp > 1 && layout.ep == 1 && c.moe.num_shared > 0) {
          tp += AllReduceBytes(c.hidden * 4, g);  // shared experts
        }
      }
    }
    p.tp_bytes = std::max(p.tp_bytes, tp);
    p.ep_bytes = std::max(p.ep_bytes, ep);
    if (!s.last_stage()) {
      const int64_t banked =
          c.attn_res_block > 0 ? (s.end_layer + c.attn_res_block - 1) / c.attn_res_block : 0;
      p.pp_bytes = std::max(p.pp_bytes, (1 + banked) * c.hidden * 4);
    }
    if (s.last_stage() && g > 1) {
      p.vocab_bytes = std::max(p.vocab_bytes, (g - 1) * ((c.vocab + g - 1) / g) * 4);
    }
  }
  p.attn_res_bytes_per_token = AttnResCacheBytes(c, 1);
  p.request_bytes_per_rank = p.kda_state_bytes_per_rank + p.kv_bytes_per_token_per_rank * context;
  // Dispatch + combine of one token to its top-k experts, bf16 activations.
  p.dispatch_bytes_per_token = c.moe.top_k * c.ExpertDim() * 2;
  p.dispatch_bytes_full_hidden = c.moe.top_k * c.hidden * 2;
  return p;
}

}  // namespace kimi
