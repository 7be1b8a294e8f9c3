// Iteration-level continuous batching over the engine's per-request state.
//
// The step contract is two calls: Schedule() builds the next StepPlan (which requests run, with
// how many tokens, at which state slot and pages); the caller runs the engine on it; Update()
// folds the result back (samples tokens, finishes requests, records prefix snapshots). Requests
// join (Add) and leave (Cancel, finish) between steps.
//
// One model covers prefill and decode: each request has `computed` and `total` tokens, and a step
// lets computed catch up under a token budget. Prefill chunks end on the 64-token grid (unless
// they finish the prompt), so how a prompt is split never changes its arithmetic: a request gets
// the same logits, and with its seed the same tokens, alone or in any batch.
//
// Thread contract: not thread-safe; one thread (the engine loop) owns a Scheduler.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/state_store.h"
#include "scheduler/allocators.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/request.h"

namespace kimi::sched {

// Preemption policies: what happens to a running request when memory runs out.
struct SwapToHost {};  // copy its KDA slot and KV pages to host memory, restore them later
struct Recompute {};   // drop its state, prefill prompt + output again later
using PreemptPolicy = std::variant<SwapToHost, Recompute>;

struct SchedulerConfig {
  int64_t max_running = 16;     // KDA state slots
  int64_t num_pages = 256;      // MLA KV pages
  int64_t page_size = 16;       // positions per page
  int64_t token_budget = 512;   // tokens per step (prefill chunks + decodes)
  int64_t max_waiting = 256;    // queue bound beyond the free slots; Add() past it is refused
  int64_t max_context = 0;      // prompt + output limit (0: the model's)
  int64_t chunk_grid = 64;      // prefill chunks end on multiples of this (KDA chunk size)
  PreemptPolicy preempt = SwapToHost{};
  int64_t prefix_interval = 256;             // tokens between prefix snapshots; 0: no cache
  int64_t prefix_cache_bytes = 256ll << 20;  // snapshot memory
  double aging_seconds = 10.0;               // waiting this long raises priority by one
};

// The longest sequence (prompt + output) that `pages` KV pages of `page_size` positions hold.
inline int64_t PoolContextLimit(int64_t pages, int64_t page_size) { return pages * page_size; }

// One request's share of a step.
struct PlannedSeq {
  Request* request;
  int64_t count;  // tokens to run
  bool sample;    // the chunk reaches the end of the known tokens: draw the next one
};

struct StepPlan {
  std::vector<PlannedSeq> seqs;
  std::vector<std::vector<int32_t>> tokens;  // per seq, the tokens to run
  std::vector<SequenceStep> batch;           // engine view (points into `tokens` and requests)
  int64_t num_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

struct SchedulerStats {
  int64_t waiting = 0, running = 0, swapped = 0;
  int64_t slots_used = 0, slots_total = 0;
  int64_t pages_used = 0, pages_total = 0;
  int64_t pages_cached = 0;  // of pages_used, those only the prefix cache holds (freed on demand)
  int64_t attn_res_bytes_used = 0, attn_res_bytes_total = 0;  // this step's AttnRes cache
  int64_t preempt_swap = 0, preempt_recompute = 0;
  int64_t prefix_queries = 0, prefix_hits = 0, prefix_saved_tokens = 0;
  int64_t prefix_entries = 0, prefix_bytes = 0;
  int64_t finished = 0;
};

class Scheduler {
 public:
  // `state` gives the pools' sizes; every change to their contents goes through `ops`.
  Scheduler(const ModelConfig& model, const SchedulerConfig& config, EngineState state,
            StateOpSink* ops);
  ~Scheduler();

  // Queues a request; ResourceExhausted when the queue is full, InvalidArgument when it can never
  // fit (prompt beyond the context or beyond what the KV pool can ever hold).
  absl::Status Add(RequestSpec spec);
  // The checks of Add() that do not depend on the queue; reads only immutable configuration, so any
  // thread may call it.
  absl::Status Validate(const RequestSpec& spec) const;
  // Marks a request cancelled; it is freed and finished at the next Schedule(). False if unknown.
  bool Cancel(const std::string& id, const std::string& reason = "cancelled");

  // Builds the next step. Requests cancelled or past their deadline are finished first; their
  // events are appended to `events`.
  StepPlan Schedule(std::vector<RequestEvent>* events);
  // Folds the engine's output for `plan` back in and returns the step's events.
  std::vector<RequestEvent> Update(StepPlan& plan, const StepOutput& out);
  // Finishes a running request now (e.g. a stop string matched in its text).
  std::vector<RequestEvent> Finish(const std::string& id, FinishReason reason,
                                   const std::string& detail);
  // Finishes every request (shutdown): reason for each, events returned.
  std::vector<RequestEvent> FinishAll(FinishReason reason, const std::string& detail);

  bool HasWork() const { return !waiting_.empty() || !running_.empty() || !swapped_.empty(); }
  // Stats().waiting alone: read under the engine loop's lock, which Submit and Cancel wait on.
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  SchedulerStats Stats() const;
  // Verifies the bookkeeping (slots unique, page refcounts equal their holders); for tests.
  absl::Status CheckInvariants() const;
  const SchedulerConfig& config() const { return config_; }
  // The largest number of requests the pools can hold at once (minimum over pools).
  int64_t Concurrency() const;
  // Tokens per step the AttnRes block cache allows (its budget is the token budget).
  int64_t TokenBudget() const { return token_budget_; }

 private:
  // Each step of Schedule() is one of these (scheduler.cc, schedule_steps.cc).
  std::vector<RequestEvent> DropCancelled();
  bool ReservePages(Request& r, int64_t upto);
  Request* Victim(const std::vector<Request*>& planned, const Request* admitted) const;
  bool PreemptOneFor(const Request& needy, const std::vector<Request*>& planned);
  bool ReserveForAdmission(Request& r, const std::vector<Request*>& planned);
  void PreemptForPriority();
  void BackToQueue(Request& r);
  void SwapOut(Request& r);
  bool SwapIn(Request& r);
  bool AdmitWaiting(Request& r);
  int64_t AwaitsSharedPrefix(const Request& w, const std::vector<Request*>& planned);
  int64_t ChunkFor(const Request& r, int64_t budget) const;
  void AddToPlan(StepPlan& plan, Request& r, int64_t count);
  void Release(Request& r);
  RequestEvent Finished(Request& r, FinishReason reason, const std::string& detail);
  void SortWaiting();
  void SortSwapped();
  void Requeue(Request& r);
  int64_t Effective(const Request& r) const;
  bool Before(const Request* a, const Request* b) const;
  void MaybeSnapshot(Request& r);

  int64_t NewHandle() { return next_handle_++; }

  const ModelConfig& model_;
  SchedulerConfig config_;
  EngineState state_;
  StateOpSink* ops_;
  int64_t next_handle_ = 1;
  SlotAllocator slots_;
  PageAllocator pages_;
  std::unique_ptr<PrefixCache> prefix_;
  int64_t token_budget_;
  std::map<std::string, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;  // priority order (SortWaiting)
  std::vector<Request*> running_;  // admission order
  std::deque<Request*> swapped_;   // by rank (SortSwapped)
  Clock::time_point now_ = Clock::now();  // of the step being scheduled: ranks age with it
  uint64_t next_arrival_ = 0;
  SchedulerStats counters_;
};

}  // namespace kimi::sched
