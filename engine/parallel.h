// How a model is split over ranks, and which piece this rank holds.
//
//   world = pp x G ranks, G = max(tp, ep). Rank r is in pipeline stage r / G at position r % G.
//   Stage s runs a contiguous range of layers (as even as possible, or as configured). Inside a
//   stage the G ranks split attention heads (KDA and MLA) and MLP columns when tp = G, and the
//   routed experts when ep = G; a side that is not split is replicated. Collectives stay inside
//   the stage; the hidden state and the AttnRes block cache cross stage boundaries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace kimi {

struct ParallelLayout {
  int tp = 1, ep = 1, pp = 1;
  std::vector<int64_t> stage_layers;  // optional: layers per stage (sums to num_layers)
  // Expert parallel: when the busiest rank holds more than this times the mean of a step's routed
  // pairs, replicate its hottest experts on idle ranks for that step (at most this many).
  double replicate_threshold = 1.25;
  int max_replicated_experts = 4;

  int group() const { return tp > ep ? tp : ep; }
  int world() const { return pp * group(); }
  bool single() const { return world() == 1; }
};

// Checks a layout against a model; errors name the setting and the model dimension at fault.
absl::Status ValidateLayout(const ModelConfig& config, const ParallelLayout& layout);

// First layer of each stage, plus num_layers at the end (pp + 1 entries).
std::vector<int64_t> StageBoundaries(const ModelConfig& config, const ParallelLayout& layout);

// This rank's piece.
struct Shard {
  ParallelLayout layout;
  int rank = 0;   // in the world
  int stage = 0;
  int local = 0;  // position in the stage group
  int64_t first_layer = 0, end_layer = 0;

  static Shard For(const ModelConfig& config, const ParallelLayout& layout, int rank);
  int tp_rank() const { return layout.tp > 1 ? local : 0; }
  int tp_size() const { return layout.tp; }
  int ep_rank() const { return layout.ep > 1 ? local : 0; }
  int ep_size() const { return layout.ep; }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == layout.pp - 1; }
  bool HasLayer(int64_t l) const { return l >= first_layer && l < end_layer; }
  // World rank of position `local` in stage `stage`.
  int RankOf(int stage, int local) const { return stage * layout.group() + local; }
  std::string Describe() const;
};

// The model as one rank sees it: head counts and widths divided by tp, the stage's layers.
// Pools built from it hold exactly this rank's share of every request's state.
ModelConfig ShardConfig(const ModelConfig& config, const Shard& shard);

}  // namespace kimi
