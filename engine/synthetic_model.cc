#include "engine/synthetic_model.h"

#include <sys/stat.h>

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/tensor_set.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

namespace kimi {

extern const char kK3ChatTemplate[];  // tokenizer/templates/k3_chat_template.jinja, embedded

namespace {

using ojson = nlohmann::ordered_json;

// Kimi reserves 256 special ids after the base ranks (KIMI_LINEAR.md 4, KIMI_K3.md 4b).
constexpr int64_t kNumSpecial = 256;

struct Preset {
  std::string name;
  bool k3 = false;
  int64_t hidden, layers, kda_heads, head_dim, mla_heads, q_lora, kv_lora, nope, rope, v_dim;
  int64_t intermediate, experts, top_k, moe_intermediate, shared, latent, attn_res_block;
  int64_t shard_bytes;  // split safetensors above this size (exercises the index path)
};

const std::vector<Preset>& Presets() {
  static const std::vector<Preset> kPresets = {
      // name, k3, hidden, layers, kda_heads, head_dim, mla_heads, q_lora, kv_lora, nope, rope, v,
      // intermediate, experts, top_k, moe_inter, shared, latent, attn_res_block, shard_bytes
      {"kimi-linear-tiny", false, 64, 6, 4, 16, 4, 0, 32, 16, 8, 16, 128, 8, 2, 32, 1, 0, 0,
       int64_t{1} << 40},
      {"kimi-linear-small", false, 1024, 16, 8, 128, 8, 0, 256, 128, 64, 128, 4096, 32, 4, 512, 1,
       0, 0, int64_t{1} << 30},
      {"k3-tiny", true, 64, 6, 4, 16, 4, 32, 32, 16, 8, 16, 128, 8, 2, 32, 2, 32, 2,
       int64_t{1} << 40},
      {"k3-mini", true, 512, 25, 4, 128, 4, 192, 128, 128, 64, 128, 2048, 64, 8, 256, 2, 256, 12,
       int64_t{1} << 28},
  };
  return kPresets;
}

const Preset* FindPreset(const std::string& name) {
  for (const Preset& p : Presets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// The layer schedule of the releases: MLA on every 4th layer (1-based) and on the last one.
void LayerLists(int64_t layers, ojson* kda, ojson* full) {
  *kda = ojson::array();
  *full = ojson::array();
  for (int64_t l = 1; l <= layers; ++l) {
    if (l % 4 == 0 || l == layers) {
      full->push_back(l);
    } else {
      kda->push_back(l);
    }
  }
}

ojson TextConfig(const Preset& p, int64_t vocab) {
  ojson kda, full;
  LayerLists(p.layers, &kda, &full);
  ojson t;
  if (p.k3) t["model_type"] = "kimi_linear";
  t["hidden_size"] = p.hidden;
  t["num_hidden_layers"] = p.layers;
  t["vocab_size"] = vocab;
  if (p.k3) t["max_position_embeddings"] = 1048576;
  t["rms_norm_eps"] = 1e-5;
  t["hidden_act"] = p.k3 ? "situ" : "silu";
  if (p.k3) {
    t["activation_situ_beta"] = 4.0;
    t["activation_situ_linear_beta"] = 25.0;
    t["attn_res_block_size"] = p.attn_res_block;
  }
  t["intermediate_size"] = p.intermediate;
  t["first_k_dense_replace"] = 1;
  t["moe_layer_freq"] = 1;
  t["num_experts"] = p.experts;
  t["num_experts_per_token"] = p.top_k;
  t["num_shared_experts"] = p.shared;
  t["moe_intermediate_size"] = p.moe_intermediate;
  if (p.k3) {
    t["routed_expert_hidden_size"] = p.latent;
    t["latent_moe_use_norm"] = true;
  }
  t["moe_renormalize"] = true;
  t["moe_router_activation_func"] = "sigmoid";
  t["routed_scaling_factor"] = p.k3 ? 1.0 : 2.446;
  t["use_grouped_topk"] = true;
  t["num_expert_group"] = 1;
  t["topk_group"] = 1;
  t["num_attention_heads"] = p.mla_heads;
  t["num_key_value_heads"] = p.mla_heads;
  t["q_lora_rank"] = p.q_lora > 0 ? ojson(p.q_lora) : ojson(nullptr);
  t["kv_lora_rank"] = p.kv_lora;
  t["qk_nope_head_dim"] = p.nope;
  t["qk_rope_head_dim"] = p.rope;
  t["v_head_dim"] = p.v_dim;
  t["mla_use_nope"] = true;
  if (p.k3) t["mla_use_output_gate"] = true;
  t["num_nextn_predict_layers"] = 0;
  ojson lin;
  lin["full_attn_layers"] = full;
  lin["kda_layers"] = kda;
  lin["num_heads"] = p.kda_heads;
  lin["head_dim"] = p.head_dim;
  lin["short_conv_kernel_size"] = 4;
  if (p.k3) {
    lin["use_full_rank_gate"] = true;
    lin["gate_lower_bound"] = -5.0;
  }
  t["linear_attn_config"] = lin;
  if (p.k3) {
    t["quantization_config"] = {{"format", "mxfp4-pack-quantized"},
                                {"quant_method", "compressed-tensors"}};
  }
  return t;
}

ojson FullConfig(const Preset& p, int64_t base_vocab) {
  const int64_t vocab = base_vocab + kNumSpecial;
  const int64_t bos = base_vocab, eos = base_vocab + 2, pad = base_vocab + 255;
  if (p.k3) {
    ojson c;
    c["architectures"] = {"KimiK3ForConditionalGeneration"};
    c["model_type"] = "kimi_k3";
    c["bos_token_id"] = bos;
    c["eos_token_id"] = eos;
    c["pad_token_id"] = pad;
    c["media_placeholder_token_id"] = base_vocab + 21;
    c["tie_word_embeddings"] = false;
    c["text_config"] = TextConfig(p, vocab);
    c["vision_config"] = {{"patch_size", 14}, {"vt_hidden_size", 16}};
    return c;
  }
  ojson c;
  c["architectures"] = {"KimiLinearForCausalLM"};
  c["bos_token_id"] = bos;
  c["eos_token_id"] = eos;
  c["pad_token_id"] = pad;
  c["dtype"] = "bfloat16";
  ojson t = TextConfig(p, vocab);
  t["head_dim"] = p.hidden / p.mla_heads;  // published but unused
  t["model_max_length"] = 1048576;
  t["model_type"] = "kimi_linear";
  t["rope_scaling"] = nullptr;
  t["rope_theta"] = 10000.0;
  t["tie_word_embeddings"] = false;
  t["use_cache"] = true;
  c.update(t);
  return c;
}

// Deterministic generator: splitmix64 seeded from (seed, tensor name).
class Rng {
 public:
  Rng(uint64_t seed, const std::string& name) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
    for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
    state_ = seed * 0x9e3779b97f4a7c15ull ^ h;
  }
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>((Next() >> 40) * (1.0 / 16777216.0));
  }

 private:
  uint64_t state_;
};

// How a tensor is initialised: uniform with the given centre and half-width.
struct Init {
  float centre = 0.0f;
  float half_width = 0.0f;
};

// Scales chosen so that activations stay O(1) through every layer and over thousands of tokens:
// projections ~ 1/sqrt(fan_in), output projections smaller, norms near 1, decays moderate.
Init InitFor(const TensorSpec& s, const ModelConfig& c) {
  const float fan_in = s.shape.size() >= 2 ? static_cast<float>(s.shape.back()) : 1.0f;
  const float unit = std::sqrt(3.0f / fan_in);  // half-width of a uniform with std 1/sqrt(fan_in)
  const std::string& n = s.name;
  if (s.shape.size() == 1 || absl::EndsWith(n, "norm.weight")) {
    if (absl::EndsWith(n, "e_score_correction_bias")) return {0.0f, 0.05f};
    return {1.0f, 0.1f};
  }
  if (absl::StrContains(n, "_res_proj")) return {0.0f, unit};
  if (absl::StrContains(n, "conv1d")) return {0.0f, 0.8f};
  if (s.group == TensorGroup::kEmbedding) return {0.0f, std::sqrt(3.0f)};
  if (absl::EndsWith(n, "f_b_proj.weight")) return {0.0f, 0.5f * unit};
  const bool output = absl::StrContains(n, "o_proj") || absl::StrContains(n, "down_proj") ||
                      absl::StrContains(n, ".w2.") || absl::StrContains(n, "routed_expert_up_proj");
  if (output) return {0.0f, 0.5f * unit};
  (void)c;
  return {0.0f, unit};
}

// Values of the few tensors whose meaning fixes their range (decay rates and biases).
bool SpecialValues(const TensorSpec& s, const ModelConfig& c, Rng& rng, std::vector<float>* out) {
  const int64_t n = s.parameters;
  out->assign(n, 0.0f);
  if (absl::EndsWith(s.name, "A_log")) {
    // A = exp(A_log) in [1, 16], as fla initialises it; K3 pads the per-head vector with zeros.
    for (int64_t h = 0; h < c.kda.num_heads; ++h) (*out)[h] = std::log(rng.Uniform(1.0f, 16.0f));
    return true;
  }
  if (absl::EndsWith(s.name, "dt_bias")) {
    for (float& v : *out) {
      if (c.kda.gate_lower_bound) {
        v = rng.Uniform(-6.0f, -2.0f);  // sigmoid(A (g + dt_bias)) small: slow decay
      } else {
        const float dt = std::exp(rng.Uniform(std::log(1e-3f), std::log(1e-1f)));
        v = dt + std::log(-std::expm1(-dt));  // inverse softplus, as Mamba-style inits do
      }
    }
    return true;
  }
  return false;
}

// Stored dtype of a float tensor, as the published checkpoints store it (KIMI_K3.md 4: conv taps,
// A_log and dt_bias fp32 in K3; Kimi Linear creates A_log and dt_bias as fp32 parameters).
DType StoredType(const TensorSpec& s, const ModelConfig& c) {
  const std::string& n = s.name;
  if (absl::EndsWith(n, "A_log") || absl::EndsWith(n, "dt_bias")) return DType::kF32;
  if (c.family == ModelFamily::kKimiK3 && absl::StrContains(n, "conv1d")) return DType::kF32;
  if (c.family == ModelFamily::kKimiLinear && absl::EndsWith(n, "e_score_correction_bias")) {
    return DType::kF32;
  }
  return DType::kBF16;
}

void AppendFloat(std::vector<uint8_t>& bytes, float v, DType t) {
  if (t == DType::kF32) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    bytes.insert(bytes.end(), b, b + 4);
  } else {
    const uint16_t h = F32ToBf16(v);
    bytes.push_back(static_cast<uint8_t>(h & 0xff));
    bytes.push_back(static_cast<uint8_t>(h >> 8));
  }
}

// Quantises a [rows, cols] fp32 matrix to MXFP4: per 32 inputs a power-of-two scale
// 2^(floor(log2(amax)) - 2) (E2M1's largest exponent is 2), codes rounded to nearest.
void PackMxfp4(const std::vector<float>& w, int64_t rows, int64_t cols,
               std::vector<uint8_t>* packed, std::vector<uint8_t>* scales) {
  packed->assign(rows * cols / 2, 0);
  scales->assign(rows * cols / 32, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* x = &w[r * cols + b * 32];
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      const int e = amax > 0.0f ? static_cast<int>(std::floor(std::log2(amax))) - 2 : -127;
      const int biased = std::clamp(e + 127, 0, 254);
      (*scales)[r * (cols / 32) + b] = static_cast<uint8_t>(biased);
      const float inv = std::ldexp(1.0f, -(biased - 127));
      for (int i = 0; i < 32; i += 2) {
        const uint8_t lo = NearestE2m1(x[i] * inv), hi = NearestE2m1(x[i + 1] * inv);
        (*packed)[r * (cols / 2) + (b * 32 + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Base vocabulary lines "base64 rank", from a tiktoken file or the 256 single bytes.
absl::StatusOr<std::string> BaseRanks(const std::string& tiktoken_path, int64_t* count) {
  std::string text;
  if (tiktoken_path.empty()) {
    for (int b = 0; b < 256; ++b) {
      const std::string byte(1, static_cast<char>(b));
      absl::StrAppend(&text, absl::Base64Escape(byte), " ", b, "\n");
    }
    *count = 256;
    return text;
  }
  std::ifstream in(tiktoken_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", tiktoken_path));
  std::stringstream ss;
  ss << in.rdbuf();
  text = ss.str();
  int64_t n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    int64_t rank = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &rank) || rank != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          tiktoken_path, ": line ", n + 1, " is not \"<base64> ", n, "\" (ranks must be dense)"));
    }
    ++n;
  }
  *count = n;
  return text;
}

// Special tokens per family, by offset from the first special id (KIMI_LINEAR.md 4,
// KIMI_K3.md 4b); the rest are <|reserved_token_{id}|>.
std::vector<std::pair<int, std::pair<std::string, bool>>> SpecialTokens(bool k3) {
  if (k3) {
    return {{0, {"[BOS]", true}},
            {1, {"[EOS]", true}},
            {2, {"<|end_of_msg|>", true}},
            {3, {"<|open|>", false}},
            {4, {"<|close|>", false}},
            {5, {"<|sep|>", false}},
            {6, {"[start_header_id]", true}},
            {7, {"[end_header_id]", true}},
            {9, {"[EOT]", true}},
            {18, {"<|media_begin|>", true}},
            {19, {"<|media_content|>", true}},
            {20, {"<|media_end|>", true}},
            {21, {"<|media_pad|>", true}},
            {65, {"<osagent_mode>", true}},
            {254, {"[UNK]", true}},
            {255, {"[PAD]", true}}};
  }
  return {{0, {"[BOS]", true}},
          {1, {"[EOS]", true}},
          {2, {"<|im_end|>", true}},
          {3, {"<|im_user|>", true}},
          {4, {"<|im_assistant|>", true}},
          {6, {"<|start_header_id|>", true}},
          {7, {"<|end_header_id|>", true}},
          {9, {"[EOT]", true}},
          {10, {"<|im_system|>", true}},
          {11, {"<|tool_calls_section_begin|>", false}},
          {12, {"<|tool_calls_section_end|>", false}},
          {13, {"<|tool_call_begin|>", false}},
          {14, {"<|tool_call_argument_begin|>", false}},
          {15, {"<|tool_call_end|>", false}},
          {17, {"<|im_middle|>", true}},
          {254, {"[UNK]", true}},
          {255, {"[PAD]", true}}};
}

std::string TokenizerConfig(bool k3, int64_t base) {
  ojson added = ojson::object();
  const auto specials = SpecialTokens(k3);
  for (int off = 0; off < kNumSpecial; ++off) {
    std::string content = absl::StrCat("<|reserved_token_", base + off, "|>");
    bool special = true;
    for (const auto& [o, tok] : specials) {
      if (o == off) {
        content = tok.first;
        special = tok.second;
      }
    }
    added[std::to_string(base + off)] = {{"content", content}, {"lstrip", false},
                                         {"normalized", false}, {"rstrip", false},
                                         {"single_word", false}, {"special", special}};
  }
  ojson cfg;
  cfg["added_tokens_decoder"] = added;
  cfg["bos_token"] = "[BOS]";
  cfg["eos_token"] = "[EOS]";
  cfg["pad_token"] = "[PAD]";
  cfg["unk_token"] = "[UNK]";
  cfg["model_max_length"] = 1048576;
  cfg["tokenizer_class"] = "TikTokenTokenizer";
  return cfg.dump(2);
}

}  // namespace

uint8_t NearestE2m1(float v) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(v);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(a - kMag[i]), db = std::fabs(a - kMag[best]);
    if (d < db || (d == db && (i % 2 == 0))) best = i;
  }
  return static_cast<uint8_t>(best | (v < 0.0f && best != 0 ? 8 : 0));
}

std::vector<std::string> SyntheticPresets() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.push_back(p.name);
  return names;
}

absl::StatusOr<std::string> PresetConfigJson(const std::string& preset, int64_t base_vocab) {
  const Preset* p = FindPreset(preset);
  if (!p) return absl::InvalidArgumentError(absl::StrCat("unknown preset \"", preset, "\""));
  return FullConfig(*p, base_vocab).dump(2);
}

absl::Status WriteSyntheticModel(const SyntheticOptions& o) {
  const Preset* p = FindPreset(o.preset);
  if (!p) {
    return absl::InvalidArgumentError(absl::StrCat("unknown preset \"", o.preset, "\""));
  }
  auto say = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out_dir, ": ", ec.message()));
  int64_t base = 0;
  auto ranks = BaseRanks(o.tiktoken_path, &base);
  if (!ranks.ok()) return ranks.status();
  const std::string config_text = FullConfig(*p, base).dump(2);
  auto config = ParseModelConfig(config_text);
  if (!config.ok()) return config.status();  // a preset must pass our own parser
  const ModelConfig& c = *config;

  if (absl::Status s = WriteText(o.out_dir + "/config.json", config_text + "\n"); !s.ok()) return s;
  if (absl::Status s = WriteText(o.out_dir + "/tiktoken.model", *ranks); !s.ok()) return s;
  if (absl::Status s = WriteText(o.out_dir + "/tokenizer_config.json",
                                 TokenizerConfig(p->k3, base) + "\n");
      !s.ok()) {
    return s;
  }

  // K3's chat format is not the Kimi Linear one: K3 checkpoints carry their own template.
  const std::string template_path = o.out_dir + "/chat_template.jinja";
  if (p->k3) {
    if (absl::Status s = WriteText(template_path, kK3ChatTemplate); !s.ok()) return s;
  } else {
    std::remove(template_path.c_str());
  }

  std::vector<TensorSpec> specs = ExpectedTensors(c);
  if (p->k3) {  // a stand-in vision tower, which loaders must skip
    TensorSpec v;
    v.name = "vision_tower.patch_embed.proj.weight";
    v.shape = {16, 3, 14, 14};
    v.parameters = 16 * 3 * 14 * 14;
    specs.push_back(v);
  }
  // Generate and write shard by shard so memory stays near one shard.
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> shard;
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> file
  std::vector<std::string> files;
  int64_t shard_size = 0;
  auto flush = [&]() -> absl::Status {
    if (shard.empty()) return absl::OkStatus();
    const std::string file = absl::StrCat("shard-", files.size(), ".safetensors");
    std::vector<TensorToWrite> tw;
    for (const Pending& t : shard) {
      tw.push_back({t.name, t.dtype, t.shape, t.bytes});
      weight_map.emplace_back(t.name, file);
    }
    if (absl::Status s = WriteSafetensors(o.out_dir + "/" + file, tw, {{"format", "pt"}});
        !s.ok()) {
      return s;
    }
    say(absl::StrCat("wrote ", file, " (", shard.size(), " tensors, ", shard_size >> 20, " MiB)"));
    files.push_back(file);
    shard.clear();
    shard_size = 0;
    return absl::OkStatus();
  };
  std::vector<float> values;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    if (s.role == TensorRole::kMxfp4Scale) continue;  // written with its packed partner
    Rng rng(o.seed, s.role == TensorRole::kMxfp4Packed
                        ? s.name.substr(0, s.name.size() - std::string("_packed").size())
                        : s.name);
    if (!SpecialValues(s, c, rng, &values)) {
      const Init init = InitFor(s, c);
      values.resize(s.parameters);
      for (float& v : values) v = init.centre + rng.Uniform(-init.half_width, init.half_width);
    }
    if (s.role == TensorRole::kMxfp4Packed) {
      const int64_t rows = s.shape[0], cols = s.shape[1] * 2;
      Pending packed{s.name, DType::kU8, s.shape, {}};
      Pending scales{specs[i + 1].name, DType::kU8, specs[i + 1].shape, {}};
      PackMxfp4(values, rows, cols, &packed.bytes, &scales.bytes);
      shard_size += packed.bytes.size() + scales.bytes.size();
      shard.push_back(std::move(packed));
      shard.push_back(std::move(scales));
    } else {
      Pending t{s.name, StoredType(s, c), s.shape, {}};
      t.bytes.reserve(values.size() * DTypeSize(t.dtype));
      for (float v : values) AppendFloat(t.bytes, v, t.dtype);
      shard_size += t.bytes.size();
      shard.push_back(std::move(t));
    }
    if (shard_size >= p->shard_bytes) {
      if (absl::Status st = flush(); !st.ok()) return st;
    }
  }
  if (absl::Status st = flush(); !st.ok()) return st;

  if (files.size() == 1) {
    const std::string from = o.out_dir + "/" + files[0];
    const std::string to = o.out_dir + "/model.safetensors";
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename ", from));
    }
    std::remove((o.out_dir + "/model.safetensors.index.json").c_str());
    say("one shard: renamed to model.safetensors");  // the line above named its working name
  } else {
    ojson index;
    index["metadata"] = {{"total_size", 0}};
    ojson map = ojson::object();
    for (const auto& [name, file] : weight_map) map[name] = file;
    index["weight_map"] = map;
    if (absl::Status s = WriteText(o.out_dir + "/model.safetensors.index.json", index.dump(2));
        !s.ok()) {
      return s;
    }
    std::remove((o.out_dir + "/model.safetensors").c_str());
  }
  say(absl::StrCat(o.preset, ": ", specs.size(), " tensors in ", files.size(), " file(s) at ",
                   o.out_dir));
  return absl::OkStatus();
}

}  // namespace kimi
