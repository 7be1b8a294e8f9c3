#include "engine/tensor_set.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kimi {
namespace {

class Builder {
 public:
  explicit Builder(const ModelConfig& c) : c_(c) {}

  void Add(const std::string& name, std::vector<int64_t> shape, TensorGroup group,
           int64_t layer = -1) {
    TensorSpec s;
    s.name = c_.tensor_prefix + name;
    s.parameters = 1;
    for (int64_t d : shape) s.parameters *= d;
    s.shape = std::move(shape);
    s.group = group;
    s.layer = layer;
    out_.push_back(std::move(s));
  }
  TensorSpec& last() { return out_.back(); }

  // A [rows, cols] projection named base + ".weight", or packed MXFP4 as compressed-tensors writes
  // it (base + ".weight_packed" and ".weight_scale").
  void Linear(const std::string& base, int64_t rows, int64_t cols, TensorGroup group,
              int64_t layer, bool mxfp4 = false, int64_t expert = -1) {
    if (!mxfp4) {
      Add(base + ".weight", {rows, cols}, group, layer);
      last().expert = expert;
      return;
    }
    Add(base + ".weight_packed", {rows, cols / 2}, group, layer);
    last().role = TensorRole::kMxfp4Packed;
    last().parameters = rows * cols;
    last().expert = expert;
    Add(base + ".weight_scale", {rows, cols / 32}, group, layer);
    last().role = TensorRole::kMxfp4Scale;
    last().parameters = 0;
    last().expert = expert;
  }

  std::vector<TensorSpec> Take() { return std::move(out_); }

 private:
  const ModelConfig& c_;
  std::vector<TensorSpec> out_;
};

void AddKda(Builder& b, const ModelConfig& c, const std::string& p, int64_t l) {
  const KdaConfig& k = c.kda;
  const int64_t P = k.projection(), d = c.hidden, hd = k.head_dim;
  for (const char* x : {"q", "k", "v"}) {
    b.Linear(absl::StrCat(p, x, "_proj"), P, d, TensorGroup::kKda, l);
  }
  for (const char* x : {"q", "k", "v"}) {
    // nn.Conv1d layout [P, 1, W]; vLLM-style exports keep [P, W]. Same bytes.
    b.Add(absl::StrCat(p, x, "_conv1d.weight"), {P, 1, k.conv_kernel}, TensorGroup::kKda, l);
    b.last().alt_shape = std::vector<int64_t>{P, k.conv_kernel};
  }
  if (c.family == ModelFamily::kKimiK3) {
    b.Add(p + "A_log", {hd}, TensorGroup::kNorm, l);  // per head, zero-padded to head_dim
  } else {
    b.Add(p + "A_log", {1, 1, k.num_heads, 1}, TensorGroup::kNorm, l);
  }
  b.Linear(p + "f_a_proj", hd, d, TensorGroup::kKda, l);
  b.Linear(p + "f_b_proj", P, hd, TensorGroup::kKda, l);
  b.Add(p + "dt_bias", {P}, TensorGroup::kNorm, l);
  b.Linear(p + "b_proj", k.num_heads, d, TensorGroup::kKda, l);
  if (k.full_rank_gate) {
    b.Linear(p + "g_proj", P, d, TensorGroup::kKda, l);
  } else {
    b.Linear(p + "g_a_proj", hd, d, TensorGroup::kKda, l);
    b.Linear(p + "g_b_proj", P, hd, TensorGroup::kKda, l);
  }
  b.Add(p + "o_norm.weight", {hd}, TensorGroup::kNorm, l);
  b.Linear(p + "o_proj", d, P, TensorGroup::kKda, l);
}

void AddMla(Builder& b, const ModelConfig& c, const std::string& p, int64_t l) {
  const MlaConfig& m = c.mla;
  const int64_t d = c.hidden, H = m.num_heads;
  if (m.q_lora_rank > 0) {
    b.Linear(p + "q_a_proj", m.q_lora_rank, d, TensorGroup::kMla, l);
    b.Add(p + "q_a_layernorm.weight", {m.q_lora_rank}, TensorGroup::kNorm, l);
    b.Linear(p + "q_b_proj", H * m.qk_head_dim(), m.q_lora_rank, TensorGroup::kMla, l);
  } else {
    b.Linear(p + "q_proj", H * m.qk_head_dim(), d, TensorGroup::kMla, l);
  }
  b.Linear(p + "kv_a_proj_with_mqa", m.cache_width(), d, TensorGroup::kMla, l);
  b.Add(p + "kv_a_layernorm.weight", {m.kv_lora_rank}, TensorGroup::kNorm, l);
  b.Linear(p + "kv_b_proj", H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank,
           TensorGroup::kMla, l);
  if (m.output_gate) b.Linear(p + "g_proj", H * m.v_head_dim, d, TensorGroup::kMla, l);
  b.Linear(p + "o_proj", d, H * m.v_head_dim, TensorGroup::kMla, l);
}

void AddMoe(Builder& b, const ModelConfig& c, const std::string& p, int64_t l) {
  const MoeConfig& m = c.moe;
  const int64_t d = c.hidden, D = c.ExpertDim();
  b.Linear(p + "gate", m.num_experts, d, TensorGroup::kRouter, l);
  b.Add(p + "gate.e_score_correction_bias", {m.num_experts}, TensorGroup::kNorm, l);
  if (m.latent_dim > 0) {
    b.Linear(p + "routed_expert_down_proj", m.latent_dim, d, TensorGroup::kLatentProj, l);
    if (m.latent_norm) {
      b.Add(p + "routed_expert_norm.weight", {m.latent_dim}, TensorGroup::kNorm, l);
    }
    b.Linear(p + "routed_expert_up_proj", d, m.latent_dim, TensorGroup::kLatentProj, l);
  }
  for (int64_t e = 0; e < m.num_experts; ++e) {
    const std::string ep = absl::StrCat(p, "experts.", e, ".");
    // w1 = gate, w2 = down, w3 = up (the checkpoint's own names).
    b.Linear(ep + "w1", m.intermediate, D, TensorGroup::kRoutedExpert, l, m.mxfp4_experts, e);
    b.Linear(ep + "w2", D, m.intermediate, TensorGroup::kRoutedExpert, l, m.mxfp4_experts, e);
    b.Linear(ep + "w3", m.intermediate, D, TensorGroup::kRoutedExpert, l, m.mxfp4_experts, e);
  }
  if (m.num_shared > 0) {
    const int64_t I = m.intermediate * m.num_shared;
    b.Linear(p + "shared_experts.gate_proj", I, d, TensorGroup::kSharedExpert, l);
    b.Linear(p + "shared_experts.up_proj", I, d, TensorGroup::kSharedExpert, l);
    b.Linear(p + "shared_experts.down_proj", d, I, TensorGroup::kSharedExpert, l);
  }
}

}  // namespace

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  Builder b(c);
  const int64_t d = c.hidden;
  b.Add("model.embed_tokens.weight", {c.vocab, d}, TensorGroup::kEmbedding);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "input_layernorm.weight", {d}, TensorGroup::kNorm, l);
    b.Add(p + "post_attention_layernorm.weight", {d}, TensorGroup::kNorm, l);
    if (c.attn_res_block > 0) {
      // Layer 0's attention-side pair exists in the checkpoint but is never read (empty bank).
      b.Add(p + "self_attention_res_norm.weight", {d}, TensorGroup::kAttnRes, l);
      b.Add(p + "self_attention_res_proj.weight", {1, d}, TensorGroup::kAttnRes, l);
      b.Add(p + "mlp_res_norm.weight", {d}, TensorGroup::kAttnRes, l);
      b.Add(p + "mlp_res_proj.weight", {1, d}, TensorGroup::kAttnRes, l);
    }
    if (c.layer_kinds[l] == LayerKind::kKda) {
      AddKda(b, c, p + "self_attn.", l);
    } else {
      AddMla(b, c, p + "self_attn.", l);
    }
    if (c.IsMoeLayer(l)) {
      AddMoe(b, c, p + "block_sparse_moe.", l);
    } else {
      for (const char* x : {"gate_proj", "up_proj"}) {
        b.Linear(absl::StrCat(p, "mlp.", x), c.dense_intermediate, d, TensorGroup::kDenseMlp, l);
      }
      b.Linear(p + "mlp.down_proj", d, c.dense_intermediate, TensorGroup::kDenseMlp, l);
    }
  }
  b.Add("model.norm.weight", {d}, TensorGroup::kNorm);
  if (c.attn_res_block > 0) {
    b.Add("model.output_attn_res_norm.weight", {d}, TensorGroup::kAttnRes);
    b.Add("model.output_attn_res_proj.weight", {1, d}, TensorGroup::kAttnRes);
  }
  b.Add("lm_head.weight", {c.vocab, d}, TensorGroup::kLmHead);
  return b.Take();
}

bool IsSkippedTensor(const ModelConfig& c, const std::string& name) {
  if (absl::StrContains(name, "rotary_emb.inv_freq")) return true;
  if (c.family == ModelFamily::kKimiK3) {
    return absl::StartsWith(name, "vision_tower.") || absl::StartsWith(name, "mm_projector.") ||
           absl::StartsWith(name, "multi_modal_projector.");
  }
  return false;
}

}  // namespace kimi
