// Runs engine steps for the scheduler's loop: the pools the scheduler sizes against, the sink its
// state operations go to, and the step itself. One process: LocalStepRunner. Many ranks:
// LeaderStepRunner on rank 0 (engine/distributed.h) with FollowerLoop on the others.
#pragma once

#include <memory>
#include <span>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/state_store.h"

namespace kimi {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // This rank's pools (their slot and page counts are the same on every rank).
  virtual EngineState state() = 0;
  virtual StateOpSink* ops() = 0;
  virtual absl::Status Run(std::span<const SequenceStep> batch, StepOutput* out) = 0;
  // Called when the loop has nothing to run for a while (keeps other ranks informed).
  virtual absl::Status Idle() { return absl::OkStatus(); }
  // The loop is stopping: release other ranks.
  virtual void Stop() {}
};

class LocalStepRunner final : public StepRunner {
 public:
  LocalStepRunner(const Model& model, int64_t slots, int64_t pages, int64_t page_size,
                  EngineOptions options = {})
      : engine_(model, EngineComms{}, options),
        kda_(model.config(), slots),
        kv_(model.config(), pages, page_size),
        store_(&kda_, &kv_),
        sink_(&store_) {}
  EngineState state() override { return {&kda_, &kv_}; }
  StateOpSink* ops() override { return &sink_; }
  absl::Status Run(std::span<const SequenceStep> batch, StepOutput* out) override {
    EngineState s{&kda_, &kv_};
    return engine_.Step(batch, s, out);
  }

 private:
  Engine engine_;
  KdaStatePool kda_;
  MlaKvCache kv_;
  StateStore store_;
  LocalStateSink sink_;
};

}  // namespace kimi
