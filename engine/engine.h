// The engine: one forward step of a loaded model over a batch that mixes prefill chunks and decode
// tokens of many requests.
//
// Thread contract: an Engine is immutable after construction and holds no per-request state.
// Step() reads and writes only the state pools passed in, at the slots and pages each sequence
// names. One thread calls Step() at a time (the kernels parallelise inside it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/comm/communicator.h"
#include "engine/state.h"
#include "engine/weights.h"
#include "kernels/cpu/matmul.h"

namespace kimi {

enum class LogitsWanted { kNone, kLast, kAll };

// One request's share of a step: `tokens` at positions pos0 .. pos0 + n - 1.
struct SequenceStep {
  int64_t kda_slot = -1;           // slot in KdaStatePool (ignored by models without KDA layers)
  std::span<const int32_t> pages;  // MLA page table covering positions [0, pos0 + n)
  int64_t pos0 = 0;                // tokens already folded into the state
  std::span<const int32_t> tokens;
  LogitsWanted logits = LogitsWanted::kLast;
};

// The checks every step runner makes before touching state: token ids inside the vocabulary,
// positions in range, KDA slots inside the pool and used once, page tables covering every
// position with pages inside the cache. Pools a model lacks are not checked (pass 0).
absl::Status ValidateBatch(const ModelConfig& config, std::span<const SequenceStep> batch,
                           int64_t num_slots, int64_t num_pages, int64_t page_size);

struct EngineState {
  KdaStatePool* kda = nullptr;
  MlaKvCache* kv = nullptr;
};

// How evenly one MoE layer's routing spread over the experts (and the expert-parallel ranks).
struct MoeLayerStats {
  int64_t layer = -1;
  int64_t tokens = 0;
  double expert_imbalance = 1.0;    // max / mean routed pairs per expert
  double rank_imbalance = 1.0;      // expert parallel: max / mean pairs per rank, owners only
  double balanced_imbalance = 1.0;  // the same after replicating hot experts
  int64_t replicated = 0;           // experts replicated on another rank this step
};

struct StepOutput {
  int64_t vocab = 0;
  std::vector<float> logits;       // [rows, vocab], fp32
  std::vector<int64_t> first_row;  // per sequence: its first row in `logits`, -1 if none
  std::vector<MoeLayerStats> moe;  // this rank's MoE layers (one entry per layer and micro-batch)
};

// The collectives of a sharded engine (see engine/parallel.h); unused in one process.
struct EngineComms {
  Communicator* stage = nullptr;  // the ranks of this rank's pipeline stage
  Communicator* world = nullptr;  // every rank: pipeline activations, logits to rank 0
};

struct EngineOptions {
  // fp32 (default) or bf16: matmul activations rounded to bf16 and run on the bf16 dot product
  // where the machine has one (kernels/cpu/matmul.h); norms, gates, router, attention and state
  // stay fp32. Faster prefill and batched decode, looser accuracy (DESIGN.md, Precision).
  cpu::ActivationDtype activation = cpu::ActivationDtype::kF32;
};

class Engine {
 public:
  // Sets the process's heap policy for step memory (KeepStepMemory, engine/step_memory.h).
  explicit Engine(const Model& model, EngineComms comms = {}, EngineOptions options = {});

  // Runs one step. Invalid input (token id out of range, slot or page missing) returns
  // InvalidArgument before any state is touched. Sharded: every rank calls Step with the same
  // batch; rank 0 gets the logits (other ranks return none), and a failed collective returns
  // its status (the caller ends the job: the ranks are out of step).
  absl::Status Step(std::span<const SequenceStep> batch, EngineState& state, StepOutput* out) const;

  const Model& model() const { return model_; }
  const EngineOptions& options() const { return options_; }

 private:
  // This rank's stage of a (micro-)batch: receives from the previous stage or embeds, runs the
  // stage's layers, sends to the next stage or computes the logits rows into `logits`.
  absl::Status RunStage(std::span<const SequenceStep> batch, EngineState& state,
                        std::vector<float>* logits, std::vector<MoeLayerStats>* moe_stats) const;

  const Model& model_;
  EngineComms comms_;
  EngineOptions options_;
};

}  // namespace kimi
