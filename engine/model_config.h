// The architecture as data: one ModelConfig, parsed from a checkpoint's config.json, drives the
// whole forward pass. Kimi Linear (`model_type: kimi_linear`) and Kimi K3 (`model_type: kimi_k3`,
// text model under `text_config`) both map onto it; K3 features are switched on by their keys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kimi {

enum class ModelFamily { kKimiLinear, kKimiK3 };
enum class LayerKind { kKda, kMla };
enum class Activation { kSiluGlu, kSituGlu };

// How the KDA state pool keeps each head's recurrent state between steps: fp32, the reference's,
// or bf16, a serving opt-in (--kda-state-dtype): half the state's memory and traffic, rounded after
// every token and every prefill chunk (kernels/cpu/kda.h). Not read from config.json.
enum class KdaStateDtype { kF32, kBf16 };
// "fp32" / "bf16" (the flag's values); false for anything else.
bool ParseKdaStateDtype(std::string_view name, KdaStateDtype* out);
const char* KdaStateDtypeName(KdaStateDtype dtype);

struct KdaConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // K = V
  int64_t conv_kernel = 4;
  bool full_rank_gate = false;             // K3: g_proj [P, hidden]; else g_a_proj/g_b_proj
  std::optional<float> gate_lower_bound;   // K3: bounded sigmoid decay; else softplus form
  KdaStateDtype state_dtype = KdaStateDtype::kF32;  // a serving choice (Model::SetKdaStateDtype)
  int64_t projection() const { return num_heads * head_dim; }
};

struct MlaConfig {
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: plain q_proj (Kimi Linear)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool output_gate = false;  // K3: o = o * sigmoid(g_proj(x)) before o_proj
  float norm_eps = 1e-6f;    // q_a_layernorm / kv_a_layernorm (see engine/model_config.cc)
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values cached per token per MLA layer: normalised latent + shared k_pe.
  int64_t cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
};

struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t intermediate = 0;  // per routed expert
  int64_t num_shared = 0;    // shared experts, stored fused as one MLP of num_shared*intermediate
  int64_t num_groups = 1;
  int64_t topk_groups = 1;
  bool renormalize = true;
  float routed_scaling = 1.0f;
  int64_t first_dense = 1;     // first_k_dense_replace
  int64_t layer_freq = 1;      // moe_layer_freq
  int64_t latent_dim = 0;      // K3 routed_expert_hidden_size; 0: experts on the full hidden
  bool latent_norm = false;    // K3 latent_moe_use_norm
  bool mxfp4_experts = false;  // routed experts stored compressed-tensors MXFP4
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kKimiLinear;
  std::string tensor_prefix;  // "" (Kimi Linear) or "language_model." (K3)
  int64_t hidden = 0;
  int64_t num_layers = 0;
  int64_t vocab = 0;
  int64_t dense_intermediate = 0;
  float rms_eps = 1e-5f;
  Activation activation = Activation::kSiluGlu;
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  int64_t attn_res_block = 0;  // K3 attn_res_block_size; 0: plain residual stream
  int64_t max_context = 0;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
  std::vector<LayerKind> layer_kinds;  // 0-based
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  std::vector<std::string> notes;  // things skipped or defaulted, for the caller to log
  // The layers this process runs (a pipeline stage; all of them in one process). Layer indices
  // stay global; per-request state exists only for these layers.
  int64_t stage_first_layer = 0;
  int64_t stage_end_layer = -1;  // -1: num_layers

  bool IsMoeLayer(int64_t layer) const {
    return moe.num_experts > 0 && layer >= moe.first_dense && layer % moe.layer_freq == 0;
  }
  int64_t NumLayersOf(LayerKind kind) const;
  // Index of `layer` among the layers of its kind.
  int64_t KindIndex(int64_t layer) const;
  int64_t StageEnd() const { return stage_end_layer < 0 ? num_layers : stage_end_layer; }
  // Layers of `kind` in this process's stage, and a stage layer's index among them (its slot in
  // the per-request state pools).
  int64_t StageLayersOf(LayerKind kind) const;
  int64_t StageIndex(int64_t layer) const;
  // AttnRes bank rows per token: ceil(num_layers / block) (row 0 = embedding), 0 without AttnRes.
  int64_t AttnResBankRows() const;
  // Width of routed experts' input/output (latent or hidden).
  int64_t ExpertDim() const { return moe.latent_dim > 0 ? moe.latent_dim : hidden; }
};

// Parses config.json text. Errors name the offending key (dotted path, e.g.
// "text_config.linear_attn_config.kda_layers").
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);
// Reads `dir`/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace kimi
