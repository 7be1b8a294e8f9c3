#include "engine/plan.h"

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

}  // namespace kimi
