// Serving one model over many ranks (SPMD). Rank 0 runs the scheduler; before every step it
// broadcasts one message: the state operations the scheduler asked for since the last step, then
// the step's batch. Every rank applies the operations to its shard of the pools and runs its shard
// of the step; rank 0 receives the logits. When idle, rank 0 sends a heartbeat that every rank
// answers (a barrier), so a follower that hears nothing for long knows rank 0 is gone, and rank 0
// learns of a follower that hangs, and either ends the job instead of waiting forever.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/step_runner.h"

namespace kimi {

enum class Command : uint8_t { kStep = 1, kHeartbeat = 2, kStop = 3 };

// The broadcast message. Encoded as little-endian integers (every rank runs the same build).
struct StepMessage {
  Command command = Command::kStep;
  std::vector<StateOp> ops;
  struct Seq {
    int64_t kda_slot = -1, pos0 = 0;
    uint8_t logits = 0;  // LogitsWanted
    std::vector<int32_t> pages, tokens;
  };
  std::vector<Seq> seqs;

  std::string Encode() const;
  static absl::StatusOr<StepMessage> Decode(const std::string& bytes);
  // The engine's view; points into this message.
  std::vector<SequenceStep> Batch() const;
};

struct DistributedOptions {
  int64_t slots = 0, pages = 0, page_size = 16;
  std::chrono::milliseconds heartbeat{2000};   // well inside follower_patience (HeartbeatFor)
  std::chrono::seconds follower_patience{30};  // silence from rank 0 this long ends the job
  EngineOptions engine;
};

// Rank 0's idle heartbeat for a follower patience: 2 s, or a third of a shorter patience (a 1 s
// patience beside a fixed 2 s heartbeat ended an idle job).
inline std::chrono::milliseconds HeartbeatFor(std::chrono::seconds patience) {
  return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(2000), patience / 3);
}

class LeaderStepRunner final : public StepRunner {
 public:
  LeaderStepRunner(const Model& model, EngineComms comms, const DistributedOptions& options);
  EngineState state() override { return {&kda_, &kv_}; }
  StateOpSink* ops() override { return &sink_; }
  absl::Status Run(std::span<const SequenceStep> batch, StepOutput* out) override;
  absl::Status Idle() override;
  void Stop() override;

 private:
  // Applies locally and keeps a copy for the next broadcast.
  class RecordingSink : public StateOpSink {
   public:
    explicit RecordingSink(StateStore* store) : store_(store) {}
    void Apply(StateOp op) override {
      store_->Apply(op);
      pending.push_back(std::move(op));
    }
    std::vector<StateOp> pending;

   private:
    StateStore* store_;
  };
  absl::Status Send(const StepMessage& m);

  Engine engine_;
  EngineComms comms_;
  DistributedOptions options_;
  KdaStatePool kda_;
  MlaKvCache kv_;
  StateStore store_;
  RecordingSink sink_;
  std::chrono::steady_clock::time_point last_sent_;
  bool stopped_ = false;
};

// The loop of every rank but 0: receive, apply, step, until rank 0 says stop. Returns the error
// that ended it (the caller ends the job) or OK on kStop.
absl::Status FollowerLoop(const Model& model, EngineComms comms,
                          const DistributedOptions& options);

}  // namespace kimi
