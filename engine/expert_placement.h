// Where each routed (token, expert) pair is computed under expert parallelism, and how balanced
// that is. Every rank derives the same placement from the same routing, so no communication is
// needed to agree on it.
//
// By default an expert runs on its owner (experts are split into equal contiguous ranges). When
// the busiest rank holds more than `threshold` times the mean load, the hottest experts of the
// busiest rank are replicated on the least busy rank for this step: the last part of the expert's
// pairs (in token order) runs there. The combine sums each token's expert outputs in ascending
// expert id whichever rank computed them, so replication changes no result.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kimi {

struct ExpertPlacement {
  std::vector<int32_t> rank_of_pair;  // [pairs]: the rank that computes routing pair i
  std::vector<int64_t> expert_load;   // [E]: pairs routed to each expert
  double rank_imbalance = 1.0;        // max / mean pairs per rank, owners only
  double balanced_imbalance = 1.0;    // the same after replication
  int64_t replicated = 0;             // experts given a replica this step
};

// ids: [pairs] expert ids of the routing (token-major, k per token). ranks: expert-parallel
// ranks (1: every pair on rank 0). threshold <= 1 or max_replicas == 0: no replication.
ExpertPlacement PlaceExperts(std::span<const int32_t> ids, int64_t num_experts, int ranks,
                             double threshold, int max_replicas);

}  // namespace kimi
