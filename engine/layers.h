// Private to engine/: the per-layer pieces of the forward pass. Each takes the normalised input of
// its sublayer for all tokens of the step and writes that sublayer's output.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace kimi::layers {

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

// True when the step holds several sequences of a few tokens each (batched decode): attention is
// then parallel over sequences rather than inside each.
inline bool ManyShortSequences(const StepLayout& layout) {
  if (layout.seqs.size() < 4) return false;
  for (const SeqSpan& s : layout.seqs) {
    if (s.count > 16) return false;
  }
  return true;
}

// x, out: [T, hidden].
void Kda(const ModelConfig& c, const KdaWeights& w, int64_t kda_index, const float* x, float* out,
         const StepLayout& layout, KdaStatePool& pool);
void Mla(const ModelConfig& c, const MlaWeights& w, int64_t mla_index, const float* x, float* out,
         const StepLayout& layout, MlaKvCache& cache);
// Gated MLP on rows of width w.gate.cols: out [rows, w.down.rows].
void GatedMlp(const ModelConfig& c, const MlpWeights& w, const float* x, float* out,
              int64_t rows);
void Moe(const ModelConfig& c, const MoeWeights& w, const float* x, float* out, int64_t rows);

}  // namespace kimi::layers
