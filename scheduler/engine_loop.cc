#include "scheduler/engine_loop.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace kimi::sched {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

EngineLoop::EngineLoop(const Model& model, LoopConfig config, std::unique_ptr<StepRunner> runner)
    : model_(model), config_(std::move(config)), runner_(std::move(runner)) {
  if (!runner_) {
    runner_ = std::make_unique<LocalStepRunner>(model, config_.scheduler.max_running,
                                                config_.scheduler.num_pages,
                                                config_.scheduler.page_size, config_.engine);
  }
  // The loop bounds the queue at Submit (where the caller can be told); the scheduler need not.
  SchedulerConfig sc = config_.scheduler;
  sc.max_waiting = std::numeric_limits<int64_t>::max();
  scheduler_ = std::make_unique<Scheduler>(model.config(), sc, runner_->state(), runner_->ops());
  concurrency_ = scheduler_->Concurrency();
  stats_ = scheduler_->Stats();
}

EngineLoop::~EngineLoop() {
  if (thread_.joinable()) Shutdown(std::chrono::milliseconds(0));
}

void EngineLoop::Start() { thread_ = std::thread([this] { Loop(); }); }

absl::Status EngineLoop::Submit(RequestSpec spec, std::vector<std::string> stop_strings,
                                std::shared_ptr<RequestSink> sink) {
  if (absl::Status s = scheduler_->Validate(spec); !s.ok()) return s;
  Live live;
  live.sink = std::move(sink);
  if (config_.text) live.text = config_.text(stop_strings);
  live.submitted = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_ || stop_) return absl::UnavailableError("server is shutting down");
  // Requests not yet running take the free state slots first (they start at the next step); the
  // rest wait, up to max_waiting. Counting only the queue refused a burst at an idle server after
  // max_waiting requests, however many slots were free.
  const int64_t queued = static_cast<int64_t>(inbox_.size()) + stats_.waiting;
  const int64_t free_slots = std::max<int64_t>(0, stats_.slots_total - stats_.slots_used);
  if (queued - free_slots >= config_.scheduler.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "queue full: ", config_.scheduler.max_waiting, " requests already waiting"));
  }
  inbox_.emplace_back(std::move(spec), std::move(live));
  wake_.notify_one();
  return absl::OkStatus();
}

void EngineLoop::Cancel(const std::string& id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.emplace_back(id, reason);
  wake_.notify_one();
}

SchedulerStats EngineLoop::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineLoop::Shutdown(std::chrono::milliseconds drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    // A later call (the server's second signal) may shorten the drain, never lengthen it.
    const Clock::time_point deadline = Clock::now() + drain;
    if (!stop_ || deadline < drain_deadline_) drain_deadline_ = deadline;
    stop_ = true;
  }
  wake_.notify_one();
  // Every caller returns once the thread has ended; only one joins it.
  std::call_once(joined_, [this] {
    if (thread_.joinable()) thread_.join();
  });
}

// Moves submitted requests and cancels into the scheduler (engine thread, lock held by caller).
void EngineLoop::TakeInbox() {
  for (auto& [spec, live] : inbox_) {
    const std::string id = spec.id;
    if (absl::Status s = scheduler_->Add(std::move(spec)); !s.ok()) {
      StreamEvent e;
      e.finish = FinishReason::kError;
      e.detail = std::string(s.message());
      e.rejected = s;
      live.sink->OnEvent(std::move(e));
      continue;
    }
    live_[id] = std::move(live);
  }
  inbox_.clear();
  for (const auto& [id, reason] : cancels_) scheduler_->Cancel(id, reason);
  cancels_.clear();
}

void EngineLoop::Deliver(std::vector<RequestEvent> events) {
  for (size_t i = 0; i < events.size(); ++i) {
    RequestEvent& ev = events[i];
    auto it = live_.find(ev.id);
    if (it == live_.end()) continue;
    Live& live = it->second;
    StreamEvent out;
    if (live.first) {
      if (live.started) out.queue_seconds = Seconds(*live.started - live.submitted);
      live.first = false;
    }
    bool stopped = false;
    if (live.text) {
      // A stop token id ends the request without its own text (an end-of-turn id is special and
      // has none; a plain token named in stop_token_ids would show), as a stop string does.
      const size_t texts = ev.tokens.size() - (ev.stop_token && !ev.tokens.empty() ? 1 : 0);
      for (size_t i = 0; i < texts && !stopped; ++i) {
        out.text += live.text->Push(ev.tokens[i].token, &stopped);
      }
    }
    out.tokens = std::move(ev.tokens);
    if (stopped && ev.finish == FinishReason::kNone) {
      // A stop string ended the text: finish the request now and free its state.
      std::vector<RequestEvent> done = scheduler_->Finish(ev.id, FinishReason::kStop, "stop string");
      if (!done.empty()) {
        ev.finish = done[0].finish;
        ev.detail = done[0].detail;
        ev.prompt_tokens = done[0].prompt_tokens;
        ev.completion_tokens = done[0].completion_tokens;
      }
    } else if (stopped && ev.finish == FinishReason::kLength) {
      // The stop string ended the text on the last token max_tokens (or the context) allowed:
      // the text stops for the string, not for the length.
      ev.finish = FinishReason::kStop;
      ev.detail = "stop string";
    } else if (ev.finish != FinishReason::kNone && live.text) {
      out.text += live.text->Finish();
    }
    out.finish = ev.finish;
    out.detail = ev.detail;
    out.prompt_tokens = ev.prompt_tokens;
    out.completion_tokens = ev.completion_tokens;
    out.cached_tokens = live.cached_tokens;
    live.sink->OnEvent(std::move(out));
    if (ev.finish != FinishReason::kNone) live_.erase(it);
  }
}

bool EngineLoop::RunOnce() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TakeInbox();
    // What left the inbox now waits in the scheduler: Submit's queue bound counts it at once, not
    // after the step.
    stats_.waiting = scheduler_->waiting();
  }
  const Clock::time_point t0 = Clock::now();
  std::vector<RequestEvent> events;
  StepPlan plan = scheduler_->Schedule(&events);
  Deliver(std::move(events));
  if (plan.empty()) {  // nothing ran, but requests may have ended: report the pools
    const SchedulerStats stats = scheduler_->Stats();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = stats;
    }
    if (config_.on_step) config_.on_step(StepStats{}, stats);
    return false;
  }
  for (const PlannedSeq& s : plan.seqs) {
    auto it = live_.find(s.request->spec.id);
    if (it == live_.end()) continue;
    it->second.cached_tokens = s.request->cached_tokens;
    if (!it->second.started) it->second.started = t0;
  }
  StepStats step;
  step.batch_size = static_cast<int64_t>(plan.seqs.size());
  step.tokens = plan.num_tokens;
  for (const PlannedSeq& s : plan.seqs) {
    (s.count == 1 && s.request->computed >= static_cast<int64_t>(s.request->spec.prompt.size())
         ? step.decode_tokens
         : step.prefill_tokens) += s.count;
  }
  const Clock::time_point t1 = Clock::now();
  StepOutput& out = step_out_;
  out.moe.clear();  // moved out below; a runner that reports no MoE statistics leaves it empty
  const absl::Status status = runner_->Run(plan.batch, &out);
  const Clock::time_point t2 = Clock::now();
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument && config_.on_fatal) {
    config_.on_fatal(status);
  }
  if (!status.ok()) {
    // An engine error ends the requests of this step, never the process.
    std::vector<RequestEvent> failed;
    for (const PlannedSeq& s : plan.seqs) {
      auto done = scheduler_->Finish(s.request->spec.id, FinishReason::kError,
                                     absl::StrCat("engine step failed: ", status.message()));
      failed.insert(failed.end(), done.begin(), done.end());
    }
    Deliver(std::move(failed));
  } else {
    Deliver(scheduler_->Update(plan, out));
  }
  step.moe = std::move(out.moe);
  step.seconds = Seconds(t2 - t1);
  step.overhead = Seconds(Clock::now() - t2) + Seconds(t1 - t0);
  const SchedulerStats stats = scheduler_->Stats();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = stats;
  }
  if (config_.on_step) config_.on_step(step, stats);
  return true;
}

void EngineLoop::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool woke = wake_.wait_for(lock, std::chrono::milliseconds(500), [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || scheduler_->HasWork();
      });
      if (!woke) {  // idle: let other ranks know rank 0 is alive
        lock.unlock();
        if (absl::Status s = runner_->Idle(); !s.ok() && config_.on_fatal) config_.on_fatal(s);
        continue;
      }
      if (stop_) {
        TakeInbox();
        const bool expired = Clock::now() >= drain_deadline_;
        if (!scheduler_->HasWork() || expired) {
          lock.unlock();
          Deliver(scheduler_->FinishAll(FinishReason::kCancelled,
                                        "server shut down before the request finished"));
          runner_->Stop();
          return;
        }
      }
    }
    if (!RunOnce() && scheduler_->HasWork()) {
      // Work exists but nothing could run (memory held by others): wait for a change.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(2));
    }
  }
}

}  // namespace kimi::sched
