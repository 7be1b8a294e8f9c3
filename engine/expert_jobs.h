// Private to engine/: the units of a MoE layer's expert work, and how the threads share them.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_config.h"
#include "engine/weights.h"

namespace kimi::layers {

// One unit of MoE work: an expert (or the shared experts) over its tokens.
struct ExpertJob {
  const MlpWeights* w;
  float* in;   // [n, width] the expert's rows, gathered by Run from src (with `rows`)
  float* out;  // [n, out width]
  int64_t n;
  double cost;
  float* gate = nullptr;  // [n, w->gate.rows] each, when gate / up are already computed
  const float* up = nullptr;
  // Row i of `in` is row rows[i] of `src` (width wide): the gather runs in the job, on its thread.
  // Without `rows`, src's first n rows are the job's rows as they are.
  const float* src = nullptr;
  const int64_t* rows = nullptr;
  int64_t width = 0;

  void Run(const ModelConfig& c) const;
  // The gather alone (with `rows`): row i of `in` = row rows[i] of `src`.
  void Gather() const;
  // The rows the products read: `in` after the gather, else `src`.
  const float* Input() const { return rows ? in : src; }
};

// A job's weight bytes, scaled up once its tokens make it compute-bound (~16 per weight pass).
double JobCost(const MlpWeights& w, int64_t n, bool down_only = false);

// The weight bytes from which the last expert of a side-by-side section is shared by the threads
// (RunExpertJobs): a kimi-linear-small expert (3 MiB) is, a k3-mini one (104 KB) is not.
inline constexpr int64_t kSharedTailMinBytes = int64_t{512} << 10;

// Runs the jobs: those larger than a thread's fair share one at a time, each MatMul split over the
// threads; the others side by side, one thread each, when a packing of them is balanced (else one
// at a time too). In the side-by-side section the routed expert with the fewest tokens, if its
// weights are at least `shared_tail_min_bytes`, is kept for last and shared by the threads in
// chunks of its rows. Each job's result is the same whichever way it runs, bit for bit.
void RunExpertJobs(const ModelConfig& c, std::vector<ExpertJob>& jobs,
                   int64_t shared_tail_min_bytes = kSharedTailMinBytes);

}  // namespace kimi::layers
