#include "engine/expert_placement.h"

#include <random>

#include "gtest/gtest.h"

namespace kimi {
namespace {

TEST(ExpertPlacement, OwnersByDefault) {
  const std::vector<int32_t> ids = {0, 5, 2, 7, 1, 4};  // 8 experts, 2 ranks: 0-3 | 4-7
  const ExpertPlacement p = PlaceExperts(ids, 8, 2, /*threshold=*/0.0, 4);
  EXPECT_EQ(p.rank_of_pair, (std::vector<int32_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_DOUBLE_EQ(p.rank_imbalance, 1.0);
  EXPECT_EQ(p.replicated, 0);
}

// A hot expert on rank 0: half the gap moves to rank 1, its last pairs in token order.
TEST(ExpertPlacement, ReplicatesTheHottestExpertOfTheBusiestRank) {
  std::vector<int32_t> ids(12, 2);  // 12 pairs to expert 2 (rank 0)
  ids.push_back(6);                 // 1 pair to expert 6 (rank 1)
  const ExpertPlacement p = PlaceExperts(ids, 8, 2, 1.25, 4);
  EXPECT_NEAR(p.rank_imbalance, 12.0 / 6.5, 1e-12);
  EXPECT_EQ(p.replicated, 1);
  int on1 = 0;
  for (size_t i = 0; i < 12; ++i) on1 += p.rank_of_pair[i] == 1;
  EXPECT_EQ(on1, 5);  // min(12 / 2, (12 - 1) / 2)
  for (size_t i = 7; i < 12; ++i) EXPECT_EQ(p.rank_of_pair[i], 1) << i;  // the last five
  EXPECT_LT(p.balanced_imbalance, p.rank_imbalance);
}

// Random routings: every pair is placed on a rank that owns or replicates its expert, the load
// never gets worse, and the replica budget holds.
TEST(ExpertPlacement, RandomRoutings) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 << (1 + trial % 3);
    const int64_t E = 8 * ranks;
    std::vector<int32_t> ids(64 + rng() % 256);
    for (auto& e : ids) e = static_cast<int32_t>(rng() % 3 == 0 ? rng() % 2 : rng() % E);
    const ExpertPlacement p = PlaceExperts(ids, E, ranks, 1.1, 3);
    EXPECT_LE(p.replicated, 3);
    EXPECT_LE(p.balanced_imbalance, p.rank_imbalance + 1e-12);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_GE(p.rank_of_pair[i], 0);
      ASSERT_LT(p.rank_of_pair[i], ranks);
    }
  }
}

}  // namespace
}  // namespace kimi
