// The engine thread: owns the engine's state pools and the scheduler, and turns queued requests
// into streamed tokens. Other threads (gRPC handlers) talk to it only through Submit / Cancel and
// the per-request sinks it calls; they never touch engine state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/step_runner.h"
#include "scheduler/scheduler.h"

namespace kimi::sched {

// Incremental text of one request: fed token ids, returns newly complete UTF-8 text, and reports
// a stop string (the text up to it is returned, nothing after it is ever returned).
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string Push(int32_t token, bool* stopped) = 0;
  virtual std::string Finish() = 0;  // whatever is held back at the end
};
using TextStreamFactory =
    std::function<std::unique_ptr<TextStream>(const std::vector<std::string>& stop_strings)>;

struct StreamEvent {
  std::vector<TokenChoice> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string detail;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // Set on a request's first event: from submission to the planning of its first step (its
  // prefill not included); -1 when it never ran.
  double queue_seconds = -1.0;
  absl::Status rejected;         // the scheduler refused the request (finish is kError)
};

// Receives one request's events, on the engine thread: must not block.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnEvent(StreamEvent event) = 0;
};

struct StepStats {
  double seconds = 0.0;      // engine step
  double overhead = 0.0;     // scheduling, sampling and streaming around it
  int64_t batch_size = 0;    // sequences
  int64_t tokens = 0;        // tokens computed
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  std::vector<MoeLayerStats> moe;  // routing balance of this rank's MoE layers
};

struct LoopConfig {
  SchedulerConfig scheduler;
  TextStreamFactory text;  // may be empty: no text, no stop strings
  EngineOptions engine;    // for the default (one-process) runner
  std::function<void(const StepStats&, const SchedulerStats&)> on_step;
  // A step failed in a way that leaves the ranks of a sharded model out of step (a collective
  // timed out, a peer died): the job cannot go on. Called on the engine thread; default: none.
  std::function<void(const absl::Status&)> on_fatal;
};

class EngineLoop {
 public:
  // `runner` runs the steps (default: this process alone, pools sized from config.scheduler).
  EngineLoop(const Model& model, LoopConfig config, std::unique_ptr<StepRunner> runner = nullptr);
  ~EngineLoop();

  void Start();
  // Queues a request. ResourceExhausted when the queue is full; Unavailable while draining.
  absl::Status Submit(RequestSpec spec, std::vector<std::string> stop_strings,
                      std::shared_ptr<RequestSink> sink);
  void Cancel(const std::string& id, const std::string& reason = "cancelled by client");
  // Stops admitting, lets running requests finish for up to `drain`, then ends the rest as
  // cancelled and joins the thread. Another thread may call it again meanwhile with a shorter
  // `drain` (a second signal: 0 ends the drain now); each call returns once the thread ended.
  void Shutdown(std::chrono::milliseconds drain);
  // Runs one step synchronously (no thread): for tests and benchmarks.
  bool RunOnce();

  SchedulerStats Stats() const;
  int64_t Concurrency() const { return concurrency_; }
  bool draining() const { return draining_; }

 private:
  struct Live {
    std::shared_ptr<RequestSink> sink;
    std::unique_ptr<TextStream> text;
    bool first = true;
    Clock::time_point submitted;
    std::optional<Clock::time_point> started;  // when its first step was planned
    int64_t cached_tokens = 0;
  };
  void Loop();
  void TakeInbox();
  void Deliver(std::vector<RequestEvent> events);

  const Model& model_;
  LoopConfig config_;
  std::unique_ptr<StepRunner> runner_;
  StepOutput step_out_;  // the engine thread's, kept between steps so its buffers are reused
  std::unique_ptr<Scheduler> scheduler_;
  int64_t concurrency_ = 0;
  std::map<std::string, Live> live_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::pair<RequestSpec, Live>> inbox_;
  std::vector<std::pair<std::string, std::string>> cancels_;
  int64_t queued_ = 0;  // inbox + scheduler waiting, for the queue bound
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  Clock::time_point drain_deadline_;
  SchedulerStats stats_;
  std::thread thread_;
  std::once_flag joined_;
};

}  // namespace kimi::sched
