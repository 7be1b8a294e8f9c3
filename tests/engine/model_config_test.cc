#include "engine/model_config.h"

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kimi {
namespace {

std::string Fixture(const std::string& name) {
  const char* src = std::getenv("KIMI_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/tests/fixtures/" + name + "/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ModelConfig, ReleasedKimiLinearLoadsUnchanged) {
  const std::string text = Fixture("kimi-linear-48b-a3b");
  ASSERT_FALSE(text.empty()) << "fixture missing (tests/fixtures)";
  auto c = ParseModelConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kKimiLinear);
  EXPECT_EQ(c->hidden, 2304);
  EXPECT_EQ(c->num_layers, 27);
  EXPECT_EQ(c->NumLayersOf(LayerKind::kKda), 20);
  EXPECT_EQ(c->NumLayersOf(LayerKind::kMla), 7);
  // 1-based lists: 0-based MLA layers are 3, 7, ..., 23, 26.
  for (int l : {3, 7, 11, 15, 19, 23, 26}) EXPECT_EQ(c->layer_kinds[l], LayerKind::kMla) << l;
  EXPECT_EQ(c->layer_kinds[0], LayerKind::kKda);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_EQ(c->moe.num_experts, 256);
  EXPECT_EQ(c->moe.top_k, 8);
  EXPECT_FLOAT_EQ(c->moe.routed_scaling, 2.446f);
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_FLOAT_EQ(c->mla.norm_eps, 1e-6f);  // HF KimiRMSNorm default for kv_a_layernorm
  EXPECT_FALSE(c->kda.gate_lower_bound.has_value());
  EXPECT_EQ(c->activation, Activation::kSiluGlu);
  EXPECT_EQ(c->attn_res_block, 0);
  EXPECT_EQ(c->max_context, 1048576);
}

TEST(ModelConfig, ReleasedK3LoadsUnchanged) {
  auto c = ParseModelConfig(Fixture("kimi-k3"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kKimiK3);
  EXPECT_EQ(c->tensor_prefix, "language_model.");
  EXPECT_EQ(c->num_layers, 93);
  EXPECT_EQ(c->NumLayersOf(LayerKind::kKda), 69);
  EXPECT_EQ(c->layer_kinds[91], LayerKind::kMla);
  EXPECT_EQ(c->layer_kinds[92], LayerKind::kMla);  // the last two are both MLA
  EXPECT_EQ(c->attn_res_block, 12);
  EXPECT_EQ(c->AttnResBankRows(), 8);
  EXPECT_EQ(c->moe.latent_dim, 3584);
  EXPECT_TRUE(c->moe.latent_norm);
  EXPECT_TRUE(c->moe.mxfp4_experts);
  EXPECT_TRUE(c->kda.full_rank_gate);
  EXPECT_FLOAT_EQ(*c->kda.gate_lower_bound, -5.0f);
  EXPECT_TRUE(c->mla.output_gate);
  EXPECT_EQ(c->mla.q_lora_rank, 1536);
  EXPECT_EQ(c->activation, Activation::kSituGlu);
  ASSERT_FALSE(c->notes.empty());  // the vision tower is skipped with a note
}

// Edits one key of the released Kimi Linear config and returns the parse error.
std::string ErrorAfter(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(Fixture("kimi-linear-48b-a3b"));
  edit(j);
  auto c = ParseModelConfig(j.dump());
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(ModelConfig, ErrorsNameTheKey) {
  using nlohmann::json;
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  std::string e = ErrorAfter([](json& j) { j["hiden_size"] = 1; });
  EXPECT_TRUE(has(e, "unknown key \"hiden_size\"")) << e;
  e = ErrorAfter([](json& j) { j.erase("hidden_size"); });
  EXPECT_TRUE(has(e, "\"hidden_size\": missing")) << e;
  e = ErrorAfter([](json& j) { j["num_experts_per_token"] = "eight"; });
  EXPECT_TRUE(has(e, "num_experts_per_token")) << e;
  e = ErrorAfter([](json& j) { j["num_experts_per_token"] = 300; });
  EXPECT_TRUE(has(e, "num_experts_per_token")) << e;
  // 256 experts in 32 groups of 8, one group kept: 8 experts for 9 places.
  e = ErrorAfter([](json& j) {
    j["num_expert_group"] = 32;
    j["num_experts_per_token"] = 9;
  });
  EXPECT_TRUE(has(e, "topk_group") && has(e, "fewer experts")) << e;
  e = ErrorAfter([](json& j) { j["linear_attn_config"]["kda_layers"].push_back(4); });
  EXPECT_TRUE(has(e, "linear_attn_config.full_attn_layers") || has(e, "listed twice")) << e;
  e = ErrorAfter([](json& j) { j["linear_attn_config"]["full_attn_layers"].erase(0); });
  EXPECT_TRUE(has(e, "layer 4 is in neither")) << e;
  e = ErrorAfter([](json& j) { j["linear_attn_config"]["kda_layers"][0] = 0; });
  EXPECT_TRUE(has(e, "1-based")) << e;
  e = ErrorAfter([](json& j) { j["linear_attn_config"]["gate_lower_bound"] = -9.0; });
  EXPECT_TRUE(has(e, "linear_attn_config.gate_lower_bound")) << e;
  e = ErrorAfter([](json& j) { j["hidden_act"] = "gelu"; });
  EXPECT_TRUE(has(e, "hidden_act")) << e;
  e = ErrorAfter([](json& j) { j["model_type"] = "llama"; });
  EXPECT_TRUE(has(e, "model_type")) << e;
  e = ErrorAfter([](json& j) { j["mla_use_nope"] = false; });
  EXPECT_TRUE(has(e, "mla_use_nope")) << e;
  // Values that once crashed the parse itself: a group count of 0 divided by (SIGFPE), and a
  // layer count of 2^62 sized a table before any check (std::length_error).
  e = ErrorAfter([](json& j) {
    j["use_grouped_topk"] = true;
    j["num_expert_group"] = 0;
  });
  EXPECT_TRUE(has(e, "num_expert_group") && has(e, "must be positive")) << e;
  e = ErrorAfter([](json& j) { j["num_hidden_layers"] = int64_t{1} << 62; });
  EXPECT_TRUE(has(e, "is in neither")) << e;
  // A negative context was a silent 1M one.
  e = ErrorAfter([](json& j) { j["model_max_length"] = -5; });
  EXPECT_TRUE(has(e, "model_max_length") && has(e, ">= 0")) << e;
  EXPECT_FALSE(ParseModelConfig("{not json").ok());
  EXPECT_FALSE(ParseModelConfig("[1, 2]").ok());
}

TEST(ModelConfig, K3NestedKeysAreNamedWithTheirPath) {
  nlohmann::json j = nlohmann::json::parse(Fixture("kimi-k3"));
  j["text_config"]["linear_attn_config"]["num_heads"] = "x";
  auto c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("text_config.linear_attn_config.num_heads"),
            std::string::npos)
      << c.status();
  j = nlohmann::json::parse(Fixture("kimi-k3"));
  j["text_config"]["quantization_config"]["format"] = "nvfp4";
  c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("text_config.quantization_config.format"),
            std::string::npos)
      << c.status();
}

}  // namespace
}  // namespace kimi
