// Private to engine/: the per-layer pieces of the forward pass. Each takes the normalised input of
// its sublayer for all tokens of the step and writes that sublayer's output.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/comm/communicator.h"
#include "engine/engine.h"
#include "engine/step_memory.h"

namespace kimi::layers {

// How this rank's sublayers are split inside its pipeline stage (see engine/parallel.h). A split
// sublayer computes a partial sum that `Reduce` completes over the stage.
struct Split {
  Communicator* stage = nullptr;  // null in one process
  bool heads = false;    // attention heads over tp: o_proj partial sums
  bool mlp = false;      // dense MLP columns over tp
  bool shared = false;   // shared-expert columns over tp (when experts are not parallel)
  bool experts = false;  // routed experts over ep, or each expert's columns over tp
  int expert_ranks = 1;  // expert parallel: ranks, and this rank's place among them
  int expert_rank = 0;
  double replicate_threshold = 0.0;  // replicate hot experts above this rank imbalance
  int max_replicas = 0;

  absl::Status Reduce(float* data, int64_t count) const {
    return stage ? stage->AllReduceSum(data, count) : absl::OkStatus();
  }
};

// Where each sequence's tokens sit in the step's token-major buffers; built once per step.
struct SeqSpan {
  int64_t offset = 0;  // first row in the step's [T, ...] buffers
  int64_t count = 0;
  int64_t pos0 = 0;
  int64_t kda_slot = -1;
  std::span<const int32_t> pages;
};

struct StepLayout {
  int64_t tokens = 0;
  std::vector<SeqSpan> seqs;
};

// A sequence of a few tokens in a step (a decode step's one), whose KDA layer is worked on by one
// thread at a time when there are several (kMinSideBySide) of them.
inline constexpr int64_t kShortSequenceTokens = 16;
inline constexpr size_t kMinSideBySide = 4;

// x, out: [T, hidden]. `c` is the rank's view (ShardConfig): head counts are this rank's.
// The outputs are complete (reduced over the stage) on return.
absl::Status Kda(const ModelConfig& c, const KdaWeights& w, int64_t kda_index, const float* x,
                 float* out, const StepLayout& layout, KdaStatePool& pool, const Split& split);
absl::Status Mla(const ModelConfig& c, const MlaWeights& w, int64_t mla_index, const float* x,
                 float* out, const StepLayout& layout, MlaKvCache& cache, const Split& split);
// Gated MLP on rows of width w.gate.cols: out [rows, w.down.rows]. Never reduces (a split
// caller reduces).
void GatedMlp(const ModelConfig& c, const MlpWeights& w, const float* x, float* out,
              int64_t rows);
// Its parts: gate = act(gate) * up over n values (the checkpoint's GLU), and, from gate and up
// [rows, w.gate.rows], out = down(act(gate) * up) (`gate` overwritten).
void GatedActivation(const ModelConfig& c, float* gate, const float* up, int64_t n);
void GatedMlpDown(const ModelConfig& c, const MlpWeights& w, float* gate, const float* up,
                  float* out, int64_t rows);
// `stats` (may be null) receives the layer's routing balance.
absl::Status Moe(const ModelConfig& c, const MoeWeights& w, const float* x, float* out,
                 int64_t rows, const Split& split, MoeLayerStats* stats);

}  // namespace kimi::layers
