#include "engine/model_config.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kimi {
namespace {

using json = nlohmann::json;

// Reads the keys of one JSON object, remembers which were read, and keeps the first error, so the
// parser below reads as a list of fields. Finish() reports keys nobody asked for.
class KeyReader {
 public:
  KeyReader(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  std::string Path(absl::string_view key) const {
    return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  }
  bool Has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  void Fail(absl::string_view key, absl::string_view what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("config.json: key \"", Path(key), "\": ", what));
    }
  }

  const json* Get(const char* key, bool required) {
    seen_.insert(key);
    if (!Has(key)) {
      if (required) Fail(key, "missing");
      return nullptr;
    }
    return &obj_.at(key);
  }

  int64_t Int(const char* key, std::optional<int64_t> def = std::nullopt) {
    const json* v = Get(key, !def.has_value());
    if (!v) return def.value_or(0);
    if (!v->is_number_integer()) {
      Fail(key, absl::StrCat("expected an integer, got ", v->dump()));
      return 0;
    }
    return v->get<int64_t>();
  }
  // A value that fails reads as 1 after its error is recorded, so that the checks after it may
  // divide by it (num_expert_group 0 ended three tools with SIGFPE).
  int64_t Positive(const char* key, std::optional<int64_t> def = std::nullopt) {
    const int64_t n = Int(key, def);
    if (n <= 0 && (Has(key) || !def)) {
      Fail(key, absl::StrCat("must be positive, got ", n));
      return 1;
    }
    return n;
  }
  double Float(const char* key, std::optional<double> def = std::nullopt) {
    const json* v = Get(key, !def.has_value());
    if (!v) return def.value_or(0.0);
    if (!v->is_number()) {
      Fail(key, absl::StrCat("expected a number, got ", v->dump()));
      return 0.0;
    }
    return v->get<double>();
  }
  bool Bool(const char* key, std::optional<bool> def = std::nullopt) {
    const json* v = Get(key, !def.has_value());
    if (!v) return def.value_or(false);
    if (!v->is_boolean()) {
      Fail(key, absl::StrCat("expected true or false, got ", v->dump()));
      return false;
    }
    return v->get<bool>();
  }
  std::string Str(const char* key, std::optional<std::string> def = std::nullopt) {
    const json* v = Get(key, !def.has_value());
    if (!v) return def.value_or("");
    if (!v->is_string()) {
      Fail(key, absl::StrCat("expected a string, got ", v->dump()));
      return "";
    }
    return v->get<std::string>();
  }
  std::vector<int64_t> IntList(const char* key) {
    const json* v = Get(key, true);
    std::vector<int64_t> out;
    if (!v) return out;
    if (!v->is_array()) {
      Fail(key, "expected a list of integers");
      return out;
    }
    for (const auto& e : *v) {
      if (!e.is_number_integer()) {
        Fail(key, absl::StrCat("expected a list of integers, found ", e.dump()));
        return {};
      }
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  const json* Object(const char* key, bool required) {
    const json* v = Get(key, required);
    if (v && !v->is_object()) {
      Fail(key, "expected an object");
      return nullptr;
    }
    return v;
  }
  // Keys that exist in published configs but do not change inference.
  void Ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) seen_.insert(k);
  }
  absl::Status Finish() {
    if (!status_.ok()) return status_;
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config.json: unknown key \"", Path(it.key()),
            "\" (not part of the kimi_linear / kimi_k3 formats this server understands)"));
      }
    }
    return absl::OkStatus();
  }
  absl::Status status() const { return status_; }
  void Merge(const absl::Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }

 private:
  const json& obj_;
  std::string path_;
  std::set<std::string> seen_;
  absl::Status status_;
};

// Attributes every transformers PretrainedConfig may serialise; none affects the forward pass.
void IgnoreCommonKeys(KeyReader& r) {
  r.Ignore({"architectures", "auto_map", "transformers_version", "dtype", "torch_dtype",
            "_name_or_path", "use_cache", "initializer_range", "return_dict", "output_attentions",
            "output_hidden_states", "torchscript", "use_bfloat16", "is_encoder_decoder",
            "tokenizer_class", "chunk_size_feed_forward", "pruned_heads", "problem_type",
            "_attn_implementation_autoset", "id2label", "label2id"});
}

absl::Status ParseLinearAttn(const json& obj, const std::string& path, int64_t num_layers,
                             ModelConfig& c) {
  KeyReader r(obj, path);
  const auto full = r.IntList("full_attn_layers");
  const auto kda = r.IntList("kda_layers");
  c.kda.num_heads = r.Positive("num_heads");
  c.kda.head_dim = r.Positive("head_dim");
  c.kda.conv_kernel = r.Positive("short_conv_kernel_size");
  c.kda.full_rank_gate = r.Bool("use_full_rank_gate", false);
  if (r.Has("gate_lower_bound")) {
    const double lb = r.Float("gate_lower_bound");
    // vLLM asserts the same range; 0 would freeze the state, below -5 is outside training.
    if (!(lb >= -5.0 && lb < 0.0)) {
      r.Fail("gate_lower_bound", absl::StrCat("must be in [-5, 0), got ", lb));
    }
    c.kda.gate_lower_bound = static_cast<float>(lb);
  } else {
    r.Get("gate_lower_bound", false);
  }
  if (!r.status().ok()) return r.status();
  // 1-based lists; together they must name every layer exactly once. Kept by layer number, not in
  // a table of num_hidden_layers rows: 2^62 asked for that table before any check.
  std::map<int64_t, int> kind_of;
  auto mark = [&](const std::vector<int64_t>& list, const char* key, int value) {
    for (int64_t one_based : list) {
      if (one_based < 1 || one_based > num_layers) {
        r.Fail(key, absl::StrCat("layer ", one_based, " is outside 1..num_hidden_layers (",
                                 num_layers, "); the lists are 1-based"));
        return;
      }
      if (!kind_of.emplace(one_based, value).second) {
        r.Fail(key, absl::StrCat("layer ", one_based, " is listed twice"));
        return;
      }
    }
  };
  mark(kda, "kda_layers", 0);
  mark(full, "full_attn_layers", 1);
  if (!r.status().ok()) return r.status();
  // Every one of 1..num_layers listed: the first missing is at most one past the lists' length.
  for (int64_t l = 1; l <= num_layers; ++l) {
    if (!kind_of.contains(l)) {
      r.Fail("kda_layers",
             absl::StrCat("layer ", l, " is in neither kda_layers nor full_attn_layers"));
      return r.status();
    }
  }
  std::vector<int> kind(num_layers);
  for (const auto& [one_based, value] : kind_of) kind[one_based - 1] = value;
  c.layer_kinds.clear();
  for (int k : kind) c.layer_kinds.push_back(k == 1 ? LayerKind::kMla : LayerKind::kKda);
  return r.Finish();
}

// The text model: the whole config for Kimi Linear, text_config for K3.
absl::Status ParseTextModel(const json& obj, const std::string& path, ModelConfig& c) {
  KeyReader r(obj, path);
  IgnoreCommonKeys(r);
  // Present in released configs, unused by KDA/MLA (NoPE) or by inference.
  r.Ignore({"head_dim", "rope_theta", "rope_scaling", "num_key_value_heads",
            "topk_method", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"});
  if (path.empty()) {
    const std::string type = r.Str("model_type");
    if (type != "kimi_linear") r.Fail("model_type", "expected \"kimi_linear\" or \"kimi_k3\"");
  } else {
    r.Str("model_type", "kimi_linear");
  }
  c.hidden = r.Positive("hidden_size");
  c.num_layers = r.Positive("num_hidden_layers");
  c.vocab = r.Positive("vocab_size");
  c.dense_intermediate = r.Positive("intermediate_size");
  c.rms_eps = static_cast<float>(r.Float("rms_norm_eps"));
  if (c.rms_eps <= 0.0f) r.Fail("rms_norm_eps", "must be positive");
  const std::string act = r.Str("hidden_act");
  if (act == "silu") {
    c.activation = Activation::kSiluGlu;
  } else if (act == "situ") {
    c.activation = Activation::kSituGlu;
  } else {
    r.Fail("hidden_act", absl::StrCat("expected \"silu\" or \"situ\", got \"", act, "\""));
  }
  c.situ_beta = static_cast<float>(r.Float("activation_situ_beta", 4.0));
  c.situ_linear_beta = static_cast<float>(r.Float("activation_situ_linear_beta", 25.0));
  c.attn_res_block = r.Int("attn_res_block_size", 0);
  if (c.attn_res_block < 0) r.Fail("attn_res_block_size", "must be >= 0");
  // Kimi Linear publishes model_max_length, K3 max_position_embeddings; nothing depends on either
  // (no RoPE), they only bound requests.
  // Both may be given (each is read, so neither is an unknown key); a negative one is an error,
  // not a silent 1M context; neither, or 0, means 1M.
  const int64_t positions = r.Int("max_position_embeddings", 0);
  const int64_t max_length = r.Int("model_max_length", 0);
  if (positions < 0) r.Fail("max_position_embeddings", "must be >= 0");
  if (max_length < 0) r.Fail("model_max_length", "must be >= 0");
  c.max_context = positions > 0 ? positions : max_length;
  if (c.max_context <= 0) c.max_context = 1 << 20;

  // MLA.
  c.mla.num_heads = r.Positive("num_attention_heads");
  c.mla.q_lora_rank = r.Int("q_lora_rank", 0);
  c.mla.kv_lora_rank = r.Positive("kv_lora_rank");
  c.mla.qk_nope_head_dim = r.Positive("qk_nope_head_dim");
  c.mla.qk_rope_head_dim = r.Int("qk_rope_head_dim");
  c.mla.v_head_dim = r.Positive("v_head_dim");
  c.mla.output_gate = r.Bool("mla_use_output_gate", false);
  if (!r.Bool("mla_use_nope")) {
    r.Fail("mla_use_nope", "only NoPE MLA (true) exists in the released checkpoints");
  }
  // kv_a_layernorm eps: the Kimi Linear reference code builds it with its RMSNorm class default
  // (1e-6); K3's serving code (vLLM, SGLang) passes rms_norm_eps. KIMI_LINEAR.md 3.2, KIMI_K3.md 5.4.
  c.mla.norm_eps = c.family == ModelFamily::kKimiK3 ? c.rms_eps : 1e-6f;

  // MoE.
  c.moe.num_experts = r.Int("num_experts", 0);
  if (c.moe.num_experts < 0) r.Fail("num_experts", "must be >= 0");
  if (c.moe.num_experts > 0) {
    c.moe.top_k = r.Positive("num_experts_per_token");
    c.moe.intermediate = r.Positive("moe_intermediate_size");
    c.moe.num_shared = r.Int("num_shared_experts", 0);
    c.moe.renormalize = r.Bool("moe_renormalize", true);
    c.moe.routed_scaling = static_cast<float>(r.Float("routed_scaling_factor", 1.0));
    c.moe.first_dense = r.Int("first_k_dense_replace", 0);
    c.moe.layer_freq = r.Positive("moe_layer_freq", 1);
    const bool grouped = r.Bool("use_grouped_topk", false);
    c.moe.num_groups = r.Positive("num_expert_group", 1);
    c.moe.topk_groups = r.Positive("topk_group", 1);
    if (!grouped) c.moe.num_groups = c.moe.topk_groups = 1;
    const std::string router = r.Str("moe_router_activation_func", "sigmoid");
    if (router != "sigmoid") {
      r.Fail("moe_router_activation_func", "only \"sigmoid\" routing exists in Kimi checkpoints");
    }
    c.moe.latent_dim = r.Int("routed_expert_hidden_size", 0);
    c.moe.latent_norm = r.Bool("latent_moe_use_norm", false);
    if (c.moe.top_k > c.moe.num_experts) {
      r.Fail("num_experts_per_token", "exceeds num_experts");
    }
    if (c.moe.num_experts % c.moe.num_groups != 0) {
      r.Fail("num_expert_group", "must divide num_experts");
    }
    if (c.moe.topk_groups > c.moe.num_groups) r.Fail("topk_group", "exceeds num_expert_group");
    if (c.moe.num_experts % c.moe.num_groups == 0 &&
        c.moe.topk_groups * (c.moe.num_experts / c.moe.num_groups) < c.moe.top_k) {
      r.Fail("topk_group", "keeps fewer experts than num_experts_per_token");
    }
    if (c.moe.latent_dim < 0) r.Fail("routed_expert_hidden_size", "must be >= 0");
  } else {
    r.Ignore({"num_experts_per_token", "moe_intermediate_size", "num_shared_experts",
              "moe_renormalize", "routed_scaling_factor", "first_k_dense_replace",
              "moe_layer_freq", "use_grouped_topk", "num_expert_group", "topk_group",
              "moe_router_activation_func", "routed_expert_hidden_size", "latent_moe_use_norm"});
  }
  if (r.Int("num_nextn_predict_layers", 0) != 0) {
    c.notes.push_back("num_nextn_predict_layers > 0: the MTP layers are not used for decoding");
  }
  if (const json* q = r.Object("quantization_config", false)) {
    KeyReader qr(*q, r.Path("quantization_config"));
    const std::string method = qr.Str("quant_method");
    const std::string format = qr.Str("format");
    if (method != "compressed-tensors") qr.Fail("quant_method", "expected \"compressed-tensors\"");
    if (format != "mxfp4-pack-quantized") qr.Fail("format", "expected \"mxfp4-pack-quantized\"");
    // The scheme's details (config_groups, ignore, ...) follow from the format: only routed
    // experts are packed (KIMI_K3.md section 4). Their presence is accepted, not interpreted.
    for (auto it = q->begin(); it != q->end(); ++it) qr.Ignore({it.key().c_str()});
    r.Merge(qr.Finish());
    c.moe.mxfp4_experts = true;
  }
  const json* lin = r.Object("linear_attn_config", true);
  if (!r.status().ok()) return r.status();
  if (absl::Status s = ParseLinearAttn(*lin, r.Path("linear_attn_config"), c.num_layers, c);
      !s.ok()) {
    return s;
  }
  // Cross-field consistency.
  if (c.family == ModelFamily::kKimiK3 && c.kda.num_heads > c.kda.head_dim) {
    r.Fail("linear_attn_config",
           "num_heads exceeds head_dim: K3 stores A_log as [head_dim] padded per head");
  }
  if (c.moe.mxfp4_experts && c.moe.num_experts > 0 &&
      (c.ExpertDim() % 32 != 0 || c.moe.intermediate % 32 != 0)) {
    r.Fail("moe_intermediate_size",
           "MXFP4 experts need expert input and intermediate sizes divisible by 32");
  }
  return r.Finish();
}

}  // namespace

int64_t ModelConfig::NumLayersOf(LayerKind kind) const {
  return std::count(layer_kinds.begin(), layer_kinds.end(), kind);
}

int64_t ModelConfig::KindIndex(int64_t layer) const {
  return std::count(layer_kinds.begin(), layer_kinds.begin() + layer, layer_kinds[layer]);
}

int64_t ModelConfig::StageLayersOf(LayerKind kind) const {
  return std::count(layer_kinds.begin() + stage_first_layer, layer_kinds.begin() + StageEnd(),
                    kind);
}

int64_t ModelConfig::StageIndex(int64_t layer) const {
  return std::count(layer_kinds.begin() + stage_first_layer, layer_kinds.begin() + layer,
                    layer_kinds[layer]);
}

int64_t ModelConfig::AttnResBankRows() const {
  return attn_res_block > 0 ? (num_layers + attn_res_block - 1) / attn_res_block : 0;
}

bool ParseKdaStateDtype(std::string_view name, KdaStateDtype* out) {
  if (name == "fp32") {
    *out = KdaStateDtype::kF32;
  } else if (name == "bf16") {
    *out = KdaStateDtype::kBf16;
  } else {
    return false;
  }
  return true;
}

const char* KdaStateDtypeName(KdaStateDtype dtype) {
  return dtype == KdaStateDtype::kBf16 ? "bf16" : "fp32";
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  json root = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  if (!root.contains("model_type") || !root["model_type"].is_string()) {
    return absl::InvalidArgumentError("config.json: key \"model_type\": missing");
  }
  const std::string type = root["model_type"].get<std::string>();
  if (type == "kimi_linear") {
    c.family = ModelFamily::kKimiLinear;
    KeyReader top(root, "");
    c.tie_word_embeddings = top.Bool("tie_word_embeddings", false);
    c.bos_token_id = top.Int("bos_token_id", -1);
    c.eos_token_id = top.Int("eos_token_id", -1);
    c.pad_token_id = top.Int("pad_token_id", -1);
    if (!top.status().ok()) return top.status();
    if (absl::Status s = ParseTextModel(root, "", c); !s.ok()) return s;
  } else if (type == "kimi_k3") {
    c.family = ModelFamily::kKimiK3;
    c.tensor_prefix = "language_model.";
    KeyReader top(root, "");
    IgnoreCommonKeys(top);
    top.Str("model_type");
    c.tie_word_embeddings = top.Bool("tie_word_embeddings", false);
    c.bos_token_id = top.Int("bos_token_id", -1);
    c.eos_token_id = top.Int("eos_token_id", -1);
    c.pad_token_id = top.Int("pad_token_id", -1);
    top.Int("media_placeholder_token_id", -1);
    if (top.Object("vision_config", false)) {
      c.notes.push_back("vision_config present: the vision tower is out of scope and skipped");
    }
    top.Ignore({"ignore_index", "use_unified_vision_chunk", "video_placeholder"});
    const json* text = top.Object("text_config", true);
    if (absl::Status s = top.Finish(); !s.ok()) return s;
    if (absl::Status s = ParseTextModel(*text, "text_config", c); !s.ok()) return s;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: key \"model_type\": \"", type, "\" is not \"kimi_linear\" or \"kimi_k3\""));
  }
  if (c.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        "config.json: key \"tie_word_embeddings\": true is not a published Kimi layout");
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto config = ParseModelConfig(ss.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace kimi
