#include "engine/weights.h"

#include <filesystem>
#include <functional>

#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "tests/engine/test_models.h"

namespace kimi {
namespace {

class WeightsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightsTest, PresetLoads) {
  std::vector<std::string> log;
  Model::Options o;
  o.log = [&](const std::string& line) { log.push_back(line); };
  auto m = Model::Load(testing::PresetDir(GetParam()), o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT((*m)->ActiveWeightBytes(), 0);
  if (GetParam().rfind("k3", 0) == 0) {
    bool skipped = false;
    for (const auto& l : log) skipped |= l.find("skipped 1 tensors") != std::string::npos;
    EXPECT_TRUE(skipped) << "the vision tower tensor should be skipped with a log line";
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, WeightsTest, ::testing::Values("kimi-linear-tiny", "k3-tiny"));

// A rank's copy (Options::copy_shard) under expert parallelism: its own experts and the layers'
// other matrices leave the mapping for packed huge pages; the other rank's experts, which expert
// replication may read, stay mapped as stored.
TEST(Weights, ShardCopyTakesThisRanksExperts) {
  Model::Options o;
  o.memory = WeightMemory::kMap;
  o.copy_shard = true;
  o.layout.ep = 2;
  o.rank = 1;
  std::vector<std::string> log;
  o.log = [&](const std::string& line) { log.push_back(line); };
  auto m = Model::Load(testing::PresetDir("k3-tiny"), o);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto regions = (*m)->WeightRegions();
  auto mapped = [&](const void* p) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (const auto& r : regions) {
      if (b >= r.data() && b < r.data() + r.size()) return true;
    }
    return false;
  };
  const ModelWeights& w = (*m)->weights();
  EXPECT_FALSE(mapped(w.lm_head.data));
  EXPECT_TRUE(w.lm_head.packed);
  int64_t moe_layers = 0;
  for (const LayerWeights& L : w.layers) {
    if (!L.is_moe) continue;
    ++moe_layers;
    const int64_t E = static_cast<int64_t>(L.moe.experts.size());
    ASSERT_EQ(E % 2, 0);
    for (int64_t x = 0; x < E; ++x) {
      const Weight& g = L.moe.experts[x].gate;
      const bool own = x >= E / 2;  // rank 1 of 2 owns the upper half
      EXPECT_EQ(mapped(g.data), !own) << "expert " << x;
      EXPECT_EQ(g.scales != nullptr && mapped(g.scales), g.scales != nullptr && !own);
      EXPECT_EQ(g.packed, own) << "expert " << x;
    }
    EXPECT_FALSE(mapped(L.moe.shared.gate.data));  // replicated on every rank, so read here
  }
  EXPECT_GT(moe_layers, 0);
  bool reported = false;
  for (const auto& l : log) reported |= l.find("MiB of this rank's matrices") != std::string::npos;
  EXPECT_TRUE(reported);
}

// Rewrites a preset's checkpoint with one edit applied and returns the load error.
std::string LoadErrorAfter(const std::string& preset,
                           const std::function<void(std::vector<TensorToWrite>&,
                                                    std::vector<std::vector<uint8_t>>&)>& edit) {
  const std::string src = testing::PresetDir(preset);
  static int counter = 0;
  const std::string dst = testing::TempDir("edit-" + std::to_string(counter++));
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto f = SafetensorsFile::Open(src + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  std::vector<TensorToWrite> list;
  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(1000);
  for (const TensorInfo& t : (*f)->tensors()) {
    list.push_back({t.name, t.dtype, t.shape, {t.data, static_cast<size_t>(t.nbytes)}});
  }
  edit(list, storage);
  EXPECT_TRUE(WriteSafetensors(dst + "/model.safetensors", list).ok());
  auto m = Model::Load(dst);
  return m.ok() ? "" : std::string(m.status().message());
}

TensorToWrite* Find(std::vector<TensorToWrite>& list, const std::string& name) {
  for (auto& t : list) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(Weights, BadTensorsAreNamed) {
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  std::string e = LoadErrorAfter("kimi-linear-tiny", [&](auto& list, auto&) {
    list.erase(std::find_if(list.begin(), list.end(), [&](auto& t) { return t.name == q; }));
  });
  EXPECT_NE(e.find("missing tensor " + q + " (expected shape [64, 64])"), std::string::npos) << e;

  e = LoadErrorAfter("kimi-linear-tiny", [&](auto& list, auto& storage) {
    storage.emplace_back(4 * 64 * 2, 0);
    list.push_back({"model.layers.0.self_attn.extra.weight", DType::kBF16, {4, 64},
                    storage.back()});
  });
  EXPECT_NE(e.find("unexpected tensor model.layers.0.self_attn.extra.weight [4, 64]"),
            std::string::npos)
      << e;

  e = LoadErrorAfter("kimi-linear-tiny", [&](auto& list, auto&) {
    Find(list, q)->shape = {32, 128};  // same bytes, wrong shape
  });
  EXPECT_NE(e.find("tensor " + q + " has shape [32, 128]"), std::string::npos) << e;
  EXPECT_NE(e.find("config implies [64, 64]"), std::string::npos) << e;

  e = LoadErrorAfter("kimi-linear-tiny", [&](auto& list, auto&) {
    TensorToWrite* t = Find(list, q);
    t->dtype = DType::kI32;
    t->shape = {64, 32};
  });
  EXPECT_NE(e.find("has shape [64, 32]"), std::string::npos) << e;

  e = LoadErrorAfter("kimi-linear-tiny", [&](auto& list, auto&) {
    TensorToWrite* t = Find(list, "model.norm.weight");
    t->dtype = DType::kI32;  // 64 bf16 = 32 i32
    t->shape = {32};
  });
  EXPECT_NE(e.find("model.norm.weight has shape [32]"), std::string::npos) << e;

  const std::string packed = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.weight_packed";
  e = LoadErrorAfter("k3-tiny", [&](auto& list, auto&) {
    TensorToWrite* t = Find(list, packed);
    t->dtype = DType::kBF16;
    t->shape[1] /= 2;
  });
  EXPECT_NE(e.find(packed), std::string::npos) << e;
}

TEST(Weights, WrongDtypeIsNamed) {
  const std::string name = "model.layers.1.block_sparse_moe.gate.e_score_correction_bias";
  const std::string e = LoadErrorAfter("kimi-linear-tiny", [&](auto& list, auto&) {
    Find(list, name)->dtype = DType::kI32;  // fp32 in this preset: same size
  });
  EXPECT_NE(e.find("tensor " + name + " has dtype I32, expected BF16, F16 or F32"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace kimi
