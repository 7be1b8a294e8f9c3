// The CUDA backend of the engine behind the scheduler's StepRunner interface (engine/step_runner.h):
// a loaded Model's weights and every request's state (KDA slots, MLA pages) live on one GPU, and
// Run() computes the same fp32 logits rows as Engine::Step (engine/engine.h).
//
//   state()  host-side KdaStatePool / MlaKvCache with the device pools' slot and page counts (the
//            scheduler sizes against them; their memory is an untouched anonymous mapping);
//   ops()    state operations applied to device memory (snapshots in host memory);
//   Run()    one step: validate, upload the plan, enqueue the forward pass -- replaying a CUDA
//            graph when every sequence is a single decode token and the batch size's bucket has
//            been captured (a bucket is captured the second time it is seen, after an eager step
//            has created every cuBLASLt plan it needs) -- then copy the logits rows back.
//
// Thread contract: one thread (the engine thread) calls Run() and the sink; the runner makes its
// device current on that thread. A failed state op is reported by the next Run().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/step_runner.h"
#include "engine/weights.h"

namespace kimi {

struct CudaRunnerOptions {
  // Activations enter bf16 GEMMs split into bf16 hi + lo (about fp32 accuracy, the CPU engine's
  // default) or rounded to bf16 once (faster, looser).
  bool fp32_activations = true;
  // One cuBLASLt algorithm per weight shape for every batch size (see kernels/cuda/gemm.h).
  bool batch_invariant = true;
  // false: no cuBLASLt; every product through the in-kernel-dequantising GEMM (fp32 activations).
  bool gemm_library = true;
  // CUDA graphs for decode steps, in buckets of powers of two up to this batch size (0: off).
  int64_t max_graph_batch = 128;
  // Initial room for a step's tokens (grows on demand; growth drops captured graphs).
  int64_t reserve_tokens = 512;
};

// Statistics for tests and benchmarks.
struct CudaRunnerStats {
  int64_t steps = 0;
  int64_t graph_replays = 0;
  int64_t graph_captures = 0;
  int64_t eager_steps = 0;
  int64_t weight_bytes = 0;  // uploaded
};

absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaStepRunner(const Model& model, int64_t slots,
                                                               int64_t pages, int64_t page_size,
                                                               int device);
absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaStepRunner(const Model& model, int64_t slots,
                                                               int64_t pages, int64_t page_size,
                                                               int device,
                                                               const CudaRunnerOptions& options);

// The statistics of a runner made by MakeCudaStepRunner (null for any other runner).
const CudaRunnerStats* CudaStats(const StepRunner* runner);

}  // namespace kimi
