// A generation request as the scheduler sees it, and the events it produces.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/sampling.h"

namespace kimi::sched {

using Clock = std::chrono::steady_clock;

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason r);

// What a client asks for; validated before it reaches the scheduler.
struct RequestSpec {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // end generation (the model's end-of-turn ids included)
  int32_t priority = 0;                 // lower runs first; FIFO within a priority
  std::optional<Clock::time_point> deadline;
};

// One step's news for one request: tokens drawn and, at the end, why it finished.
struct RequestEvent {
  std::string id;
  std::vector<TokenChoice> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string detail;  // why it finished, for logs and error statuses
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  bool stop_token = false;  // the last token is a stop token id (its text is not output)
};

enum class RequestState { kWaiting, kRunning, kSwapped, kFinished };

// Scheduler-internal record. Positions 0..computed-1 of tokens() are folded into the state.
struct Request {
  RequestSpec spec;
  uint64_t arrival = 0;  // admission order
  Clock::time_point arrived;
  RequestState state = RequestState::kWaiting;
  std::vector<TokenChoice> output;
  std::vector<int32_t> output_ids;
  int64_t computed = 0;
  int64_t kda_slot = -1;
  std::vector<int32_t> pages;
  bool cancel = false;
  std::string cancel_reason;
  // Snapshot handles while swapped out to host memory: the KDA slot and the KV pages.
  int64_t swap_slot = -1;
  int64_t swap_pages = -1;
  int64_t swap_page_count = 0;
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;  // prompt tokens restored from the prefix cache

  int64_t total() const {
    return static_cast<int64_t>(spec.prompt.size() + output_ids.size());
  }
  int32_t token_at(int64_t i) const {
    const int64_t p = static_cast<int64_t>(spec.prompt.size());
    return i < p ? spec.prompt[i] : output_ids[i - p];
  }
};

}  // namespace kimi::sched
