#include "engine/plan.h"

#include <fstream>
#include <sstream>

#include "engine/tensor_set.h"
#include "gtest/gtest.h"

namespace kimi {
namespace {

ModelConfig Released(const std::string& name) {
  const char* src = std::getenv("KIMI_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/tests/fixtures/" + name + "/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = ParseModelConfig(ss.str());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

// Counts of the real checkpoint indexes (../shared/fixtures/README.md).
TEST(Plan, KimiLinearMatchesTheReleasedIndex) {
  const ModelPlan p = PlanModel(Released("kimi-linear-48b-a3b"));
  EXPECT_EQ(p.tensors, 20493);
  EXPECT_EQ(p.parameters, 49122681728);
  // Per request: 20 KDA layers x (32 x 128 x 128 + 3 x 3 x 4096) fp32.
  EXPECT_EQ(p.kda_state_bytes, 20 * (32 * 128 * 128 + 3 * 3 * 4096) * 4);
  EXPECT_EQ(p.kv_bytes_per_token, 7 * 576 * 4);
  EXPECT_EQ(p.attn_res_bytes_per_token, 0);
  // With the bf16 state (--kda-state-dtype bf16) the recurrent part takes 2 bytes a value.
  ModelConfig bf16 = Released("kimi-linear-48b-a3b");
  bf16.kda.state_dtype = KdaStateDtype::kBf16;
  EXPECT_EQ(PlanModel(bf16).kda_state_bytes, 20 * (32 * 128 * 128 * 2 + 3 * 3 * 4096 * 4));
}

TEST(Plan, K3MatchesTheReleasedIndex) {
  const ModelPlan p = PlanModel(Released("kimi-k3"));
  EXPECT_EQ(p.tensors, 497052);
  EXPECT_EQ(p.parameters, 2779484478208);
  EXPECT_EQ(p.active_parameters, 104189614848);
  EXPECT_EQ(p.kv_bytes_per_token, 24 * 576 * 4);
  EXPECT_EQ(p.attn_res_bytes_per_token, 8 * 7168 * 4);
  EXPECT_EQ(p.kda_layers, 69);
  EXPECT_EQ(p.mla_layers, 24);
}

TEST(Plan, K3TensorNamesAreThePublishedOnes) {
  const auto specs = ExpectedTensors(Released("kimi-k3"));
  auto has = [&](const std::string& name) {
    for (const auto& s : specs) {
      if (s.name == name) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("language_model.model.embed_tokens.weight"));
  EXPECT_TRUE(has("language_model.lm_head.weight"));
  EXPECT_TRUE(has("language_model.model.layers.1.block_sparse_moe.experts.895.w2.weight_packed"));
  EXPECT_TRUE(has("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale"));
  EXPECT_TRUE(has("language_model.model.layers.0.self_attn.g_proj.weight"));
  EXPECT_TRUE(has("language_model.model.layers.3.self_attn.q_a_proj.weight"));
  EXPECT_TRUE(has("language_model.model.layers.0.self_attention_res_proj.weight"));
  EXPECT_TRUE(has("language_model.model.output_attn_res_norm.weight"));
  int64_t layer1 = 0;
  for (const auto& s : specs) layer1 += s.layer == 1;
  EXPECT_EQ(layer1, 5404);  // KIMI_K3.md 4: "Layer 1 holds 5404 real tensors"
}

}  // namespace
}  // namespace kimi
