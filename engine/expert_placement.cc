#include "engine/expert_placement.h"

#include <algorithm>

namespace kimi {

ExpertPlacement PlaceExperts(std::span<const int32_t> ids, int64_t num_experts, int ranks,
                             double threshold, int max_replicas) {
  ExpertPlacement p;
  const int64_t pairs = static_cast<int64_t>(ids.size());
  p.expert_load.assign(num_experts, 0);
  for (int32_t e : ids) ++p.expert_load[e];
  const int64_t per = num_experts / ranks;
  auto owner = [&](int64_t e) { return static_cast<int>(e / per); };
  std::vector<int64_t> rank_load(ranks, 0);
  for (int64_t e = 0; e < num_experts; ++e) rank_load[owner(e)] += p.expert_load[e];
  const double mean = static_cast<double>(pairs) / ranks;
  auto imbalance = [&] {
    return mean > 0 ? static_cast<double>(*std::max_element(rank_load.begin(), rank_load.end())) /
                          mean
                    : 1.0;
  };
  p.rank_imbalance = imbalance();

  // Greedy: move half the gap between the busiest and the least busy rank, in one of the busiest
  // rank's hottest experts, until balanced enough or out of replicas.
  std::vector<int32_t> replica(num_experts, -1);
  std::vector<int64_t> moved(num_experts, 0);
  if (ranks > 1 && threshold > 1.0) {
    for (int round = 0; round < max_replicas && imbalance() > threshold; ++round) {
      const int busy = static_cast<int>(std::max_element(rank_load.begin(), rank_load.end()) -
                                        rank_load.begin());
      const int idle = static_cast<int>(std::min_element(rank_load.begin(), rank_load.end()) -
                                        rank_load.begin());
      int64_t hot = -1;
      for (int64_t e = static_cast<int64_t>(busy) * per; e < (busy + 1) * per; ++e) {
        if (replica[e] < 0 && p.expert_load[e] >= 2 &&
            (hot < 0 || p.expert_load[e] > p.expert_load[hot])) {
          hot = e;
        }
      }
      const int64_t move =
          hot < 0 ? 0 : std::min(p.expert_load[hot] / 2, (rank_load[busy] - rank_load[idle]) / 2);
      if (move <= 0) break;
      replica[hot] = idle;
      moved[hot] = move;
      rank_load[busy] -= move;
      rank_load[idle] += move;
      ++p.replicated;
    }
  }
  p.balanced_imbalance = imbalance();

  // Pairs of a replicated expert: the last `moved` of them, in token order, go to the replica.
  std::vector<int64_t> remaining(num_experts);
  for (int64_t e = 0; e < num_experts; ++e) remaining[e] = p.expert_load[e];
  p.rank_of_pair.resize(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t e = ids[i];
    const bool to_replica = replica[e] >= 0 && remaining[e] <= moved[e];
    p.rank_of_pair[i] = to_replica ? replica[e] : owner(e);
    --remaining[e];
  }
  return p;
}

}  // namespace kimi
