// Schedule() and its steps: drop cancelled requests, give running requests their tokens (freeing
// memory by preemption when pages run out), resume swapped requests, admit waiting ones, and
// build the engine batch.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "scheduler/scheduler.h"

namespace kimi::sched {
namespace {

// Waiting requests passed over in one step before admission stops (AwaitsSharedPrefix).
constexpr size_t kMaxPassedOver = 16;

}  // namespace

std::vector<RequestEvent> Scheduler::DropCancelled() {
  std::vector<RequestEvent> events;
  const Clock::time_point now = Clock::now();
  std::vector<Request*> done;
  for (auto& [id, r] : requests_) {
    if (!r->cancel && r->spec.deadline && now >= *r->spec.deadline) {
      r->cancel = true;
      r->cancel_reason = "deadline exceeded";
    }
    if (r->cancel) done.push_back(r.get());
  }
  for (Request* r : done) events.push_back(Finished(*r, FinishReason::kCancelled, r->cancel_reason));
  return events;
}

// A request's rank: its priority minus one per aging period since it arrived (no request starves
// behind a stream of urgent ones), then its arrival. Every choice between requests uses it: the
// waiting order, which of a swapped and a waiting request starts next, the victims. Mixing it
// with the plain priority let a preempted old request come back ahead of the one it had yielded
// to, and re-prefill, every step; and a swapped request ordered by arrival alone could block a
// waiting one that blocked it back, with nothing running.
int64_t Scheduler::Effective(const Request& r) const {
  const double waited = std::chrono::duration<double>(now_ - r.arrived).count();
  return r.spec.priority - static_cast<int64_t>(std::floor(waited / config_.aging_seconds));
}

bool Scheduler::Before(const Request* a, const Request* b) const {
  const int64_t ea = Effective(*a), eb = Effective(*b);
  return ea != eb ? ea < eb : a->arrival < b->arrival;
}

void Scheduler::SortWaiting() {
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [&](const Request* a, const Request* b) { return Before(a, b); });
}

// Back into the waiting queue at its rank's place (a preempted request of low rank must not start
// ahead of the one it yielded to), so the queue stays in order through a step.
void Scheduler::Requeue(Request& r) {
  waiting_.insert(
      std::upper_bound(waiting_.begin(), waiting_.end(), &r,
                       [&](const Request* a, const Request* b) { return Before(a, b); }),
      &r);
}

void Scheduler::SortSwapped() {
  std::sort(swapped_.begin(), swapped_.end(),
            [&](const Request* a, const Request* b) { return Before(a, b); });
}

// Tokens `r` runs this step under `budget`. A chunk that does not finish the known tokens ends
// on the chunk grid, so splitting never changes the KDA arithmetic (the prefix interval is a
// multiple of the grid, so stopping at snapshot boundaries keeps this).
int64_t Scheduler::ChunkFor(const Request& r, int64_t budget) const {
  const int64_t remaining = r.total() - r.computed;
  int64_t n = std::min(remaining, budget);
  if (n <= 0) return 0;
  if (n < remaining) n = (r.computed + n) / config_.chunk_grid * config_.chunk_grid - r.computed;
  // With the prefix cache on, chunks stop at snapshot boundaries so the state there exists.
  if (prefix_) {
    const int64_t boundary = (r.computed / prefix_->interval() + 1) * prefix_->interval();
    n = std::min(n, boundary - r.computed);
  }
  return std::max<int64_t>(n, 0);
}

// Pages for positions [0, upto); all or nothing.
bool Scheduler::ReservePages(Request& r, int64_t upto) {
  const int64_t needed = (upto + config_.page_size - 1) / config_.page_size;
  const int64_t missing = needed - static_cast<int64_t>(r.pages.size());
  if (missing <= 0) return true;
  if (pages_.free() < missing && !(prefix_ && prefix_->FreePages(missing))) return false;
  for (int64_t i = 0; i < missing; ++i) r.pages.push_back(*pages_.Acquire());
  return true;
}

// A running request with nothing computed beyond what the prefix cache gave goes back to the front
// of the queue, holding nothing.
void Scheduler::BackToQueue(Request& r) {
  running_.erase(std::remove(running_.begin(), running_.end(), &r), running_.end());
  Release(r);
  r.computed = 0;
  r.cached_tokens = 0;
  r.state = RequestState::kWaiting;
  Requeue(r);
}

void Scheduler::SwapOut(Request& r) {
  if (r.computed == r.cached_tokens && r.output_ids.empty()) {
    BackToQueue(r);
    return;
  }
  running_.erase(std::remove(running_.begin(), running_.end(), &r), running_.end());
  if (std::holds_alternative<SwapToHost>(config_.preempt)) {
    r.swap_slot = NewHandle();
    ops_->Apply({StateOpKind::kSaveSlot, r.kda_slot, r.swap_slot, {}});
    r.swap_pages = NewHandle();
    r.swap_page_count = static_cast<int64_t>(r.pages.size());
    ops_->Apply({StateOpKind::kSavePages, -1, r.swap_pages, r.pages});
    ++counters_.preempt_swap;
    // Release() drops snapshots it finds: detach them first, they are what the swap keeps.
    const int64_t slot_handle = r.swap_slot, pages_handle = r.swap_pages;
    r.swap_slot = r.swap_pages = -1;
    Release(r);
    r.swap_slot = slot_handle;
    r.swap_pages = pages_handle;
    r.state = RequestState::kSwapped;
    swapped_.push_back(&r);
    SortSwapped();
  } else {
    ++counters_.preempt_recompute;
    Release(r);
    r.computed = 0;  // prompt + output so far are prefilled again
    r.state = RequestState::kWaiting;
    Requeue(r);
  }
  ++r.preemptions;
}

bool Scheduler::SwapIn(Request& r) {
  const int64_t n_pages = r.swap_page_count;
  if (slots_.free() == 0) return false;
  // Room for its pages and the one its next token may start, as admission asks: with its own
  // only, a request swapped out at a page boundary came back and swapped itself out again at
  // once, every step until another request took a page (14-16 swaps for one stall).
  const int64_t need =
      std::max(n_pages, (r.total() + 1 + config_.page_size - 1) / config_.page_size);
  if (pages_.free() < need && !(prefix_ && prefix_->FreePages(need))) return false;
  r.kda_slot = *slots_.Acquire();
  for (int64_t i = 0; i < n_pages; ++i) r.pages.push_back(*pages_.Acquire());
  ops_->Apply({StateOpKind::kLoadSlot, r.kda_slot, r.swap_slot, {}});
  ops_->Apply({StateOpKind::kLoadPages, -1, r.swap_pages, r.pages});
  ops_->Apply({StateOpKind::kDrop, -1, r.swap_slot, {}});
  ops_->Apply({StateOpKind::kDrop, -1, r.swap_pages, {}});
  r.swap_slot = r.swap_pages = -1;
  r.state = RequestState::kRunning;
  running_.push_back(&r);
  return true;
}

// Gives a waiting request a slot, restoring the deepest matching prefix snapshot.
bool Scheduler::AdmitWaiting(Request& r) {
  if (slots_.free() == 0) return false;
  r.kda_slot = *slots_.Acquire();
  r.computed = 0;
  ops_->Apply({StateOpKind::kClearSlot, r.kda_slot, -1, {}});
  if (prefix_) {
    std::vector<int32_t> tokens(r.total());
    for (int64_t i = 0; i < r.total(); ++i) tokens[i] = r.token_at(i);
    // At least one token must run to produce logits. Counted once the admission holds
    // (Schedule): one that does not fit is rolled back and looked up again next step.
    const PrefixCache::Hit hit = prefix_->Lookup(tokens, r.total() - 1, /*count=*/false);
    if (hit.tokens > 0) {
      ops_->Apply({StateOpKind::kLoadSlot, r.kda_slot, hit.handle, {}});
      for (int32_t p : hit.pages) {
        pages_.Ref(p);
        r.pages.push_back(p);
      }
      r.computed = hit.tokens;
      r.cached_tokens = hit.tokens;
    }
  }
  r.state = RequestState::kRunning;
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &r), waiting_.end());
  running_.push_back(&r);
  return true;
}

// The prefix `w` should wait for (0: none): one that a request of `running`, ranked ahead of it,
// will snapshot and that is deeper than what the cache holds, instead of prefilling the same
// tokens beside it (the n choices of one prompt, or requests with one long system prompt arriving
// together, each prefilled all of it). Restoring the snapshot gives the state a prefill gives
// (chunks on the same grid), so nothing but the work changes. The wait is bounded: the other
// request reaches the boundary within its prompt, and one that is preempted or finishes ends it.
// Only a request ranked ahead is waited for (one ranked behind may get no budget for steps), and
// only when the cache holds more snapshots than a step can insert, so that the step that makes the
// awaited one cannot evict it. Nothing pins it after that: a waiter that then cannot start for
// many steps (requests of higher priority taking the budget) may find it evicted and prefill.
int64_t Scheduler::AwaitsSharedPrefix(const Request& w, const std::vector<Request*>& running) {
  const int64_t interval = prefix_->interval();
  const int64_t limit = w.total() - 1;  // at least one token must run to produce logits
  if (limit < interval || prefix_->capacity() <= config_.max_running) return 0;
  // The prompt and what the cache holds of it, read only once a request shares a boundary with it
  // (most waiting requests share none: admission looks the prompt up itself).
  std::vector<int32_t> tokens;
  int64_t cached = -1;
  for (const Request* r : running) {
    if ((r->computed / interval + 1) * interval > limit) continue;  // past every one `w` could use
    if (!Before(r, &w)) continue;
    const int64_t most = std::min(limit, r->total());
    int64_t common = 0;
    while (common < most && r->token_at(common) == w.token_at(common)) ++common;
    const int64_t boundary = common / interval * interval;
    if (boundary <= r->computed) continue;
    if (cached < 0) {
      tokens.resize(w.total());
      for (int64_t i = 0; i < w.total(); ++i) tokens[i] = w.token_at(i);
      cached = prefix_->Lookup(tokens, limit, /*count=*/false).tokens;
    }
    if (boundary > cached && prefix_->Wants(std::span<const int32_t>(tokens.data(), boundary))) {
      return boundary;
    }
  }
  return 0;
}

// The running request that should yield: the last by rank, not planned this step; with
// `admitted`, only requests of lower (effective) priority than it (and never it).
Request* Scheduler::Victim(const std::vector<Request*>& planned, const Request* admitted) const {
  Request* victim = nullptr;
  for (Request* r : running_) {
    if (std::find(planned.begin(), planned.end(), r) != planned.end()) continue;
    if (admitted && (r == admitted || Effective(*r) <= Effective(*admitted))) continue;
    if (!victim || Before(victim, r)) victim = r;
  }
  return victim;
}

// A waiting request that outranks running ones takes their place when it cannot start otherwise
// (no slot, or too few pages for its known tokens and the next): admission's own reservation
// only reaches requests not yet planned this step, and by then every running one is, so a
// request of priority 0 waited for one of priority 5 to finish. The running requests that yield
// are the lowest priority, latest arrival first, and only as many as make room; none when even
// all of them would not.
void Scheduler::PreemptForPriority() {
  if (waiting_.empty() || running_.empty()) return;
  const Request& next = *waiting_.front();
  if (!swapped_.empty() && !Before(&next, swapped_.front())) return;  // that one starts first
  const int64_t needed = (next.total() + 1 + config_.page_size - 1) / config_.page_size;
  // Pages the prefix cache alone holds are freed for admission before any request is preempted.
  int64_t slots = slots_.free(), pages = pages_.free() + (prefix_ ? prefix_->FreeablePages() : 0);
  auto fits = [&] { return slots > 0 && pages >= needed; };
  if (fits()) return;
  // It waits for a request ranked ahead of it, which runs first (AwaitsSharedPrefix).
  if (prefix_ && AwaitsSharedPrefix(next, running_) > 0) return;
  std::vector<Request*> lower;
  for (Request* r : running_) {
    if (Effective(*r) > Effective(next)) lower.push_back(r);
  }
  std::sort(lower.begin(), lower.end(),
            [&](const Request* a, const Request* b) { return Before(b, a); });
  size_t yield = 0;
  for (; yield < lower.size() && !fits(); ++yield) {
    ++slots;
    pages += static_cast<int64_t>(lower[yield]->pages.size());  // at most: some may be shared
  }
  if (!fits()) return;
  for (size_t i = 0; i < yield; ++i) SwapOut(*lower[i]);
}

// Frees memory for `needy` by preempting the running request that should yield (needy itself as
// a last resort).
bool Scheduler::PreemptOneFor(const Request& needy, const std::vector<Request*>& planned) {
  Request* victim = Victim(planned, nullptr);
  if (!victim) return false;
  SwapOut(*victim);
  return victim != &needy;
}

// Pages for every token an admitted request knows (prompt, and output so far after a recompute
// preemption) and the one it samples next, freed if need be from running requests of lower
// priority only. Admitted against pages the running requests are about to need, a request (or
// they) would be preempted again at the next page boundary: under recompute, 12 requests in a
// small pool took 706 preemptions and 21x their prompts in prefill.
bool Scheduler::ReserveForAdmission(Request& r, const std::vector<Request*>& planned) {
  while (!ReservePages(r, r.total() + 1)) {
    Request* victim = Victim(planned, &r);
    if (!victim) return false;
    SwapOut(*victim);
  }
  return true;
}

void Scheduler::AddToPlan(StepPlan& plan, Request& r, int64_t count) {
  std::vector<int32_t> tokens(count);
  for (int64_t i = 0; i < count; ++i) tokens[i] = r.token_at(r.computed + i);
  const bool sample = r.computed + count == r.total();
  plan.seqs.push_back({&r, count, sample});
  plan.tokens.push_back(std::move(tokens));
  plan.num_tokens += count;
}

StepPlan Scheduler::Schedule(std::vector<RequestEvent>* events) {
  std::vector<RequestEvent> dropped = DropCancelled();
  events->insert(events->end(), std::make_move_iterator(dropped.begin()),
                 std::make_move_iterator(dropped.end()));
  StepPlan plan;
  int64_t budget = token_budget_;
  std::vector<Request*> planned;
  auto is_planned = [&](const Request* r) {
    return std::find(planned.begin(), planned.end(), r) != planned.end();
  };
  // Runs `r` this step if budget and pages allow, preempting unplanned requests for pages.
  auto try_run = [&](Request& r) {
    const int64_t n = ChunkFor(r, budget);
    if (n == 0) return;
    while (!ReservePages(r, r.computed + n)) {
      if (!PreemptOneFor(r, planned)) return;  // r itself was preempted (or nothing could be)
    }
    AddToPlan(plan, r, n);
    planned.push_back(&r);
    budget -= n;
  };

  // 0. Room for a waiting request that outranks running ones.
  now_ = Clock::now();
  SortWaiting();
  SortSwapped();
  PreemptForPriority();
  // 1. Running requests by rank: when pages run out, the victims are the last by rank not planned
  // yet (in admission order, a request of priority 5 planned first kept running while one of
  // priority 0 was preempted).
  std::vector<Request*> running = running_;
  std::stable_sort(running.begin(), running.end(),
                   [&](const Request* a, const Request* b) { return Before(a, b); });
  for (Request* r : running) {
    if (r->state == RequestState::kRunning && !is_planned(r)) try_run(*r);
  }
  // 2. Swapped and waiting requests, the first by rank each time (a swapped one before a waiting
  // one of the same rank: its work is kept); stop at the first that does not fit (no
  // overtaking). One order for both: a rule for each let them block each other for good. A
  // waiting request that awaits a shared prefix (AwaitsSharedPrefix) is passed over this step.
  size_t next_waiting = 0;  // the waiting requests before it are passed over
  // What the passed-over requests will need: a request after them starts only in what is left,
  // so that passing one over never costs it its place.
  int64_t claimed_slots = 0, claimed_pages = 0;
  const auto pages_for = [&](int64_t positions) {
    return (positions + config_.page_size - 1) / config_.page_size;
  };
  const auto leaves_claims = [&](int64_t pages_needed) {
    if (claimed_slots == 0) return true;
    if (slots_.free() <= claimed_slots) return false;
    const int64_t free = pages_.free() - claimed_pages;
    // The pages only the cache holds (a scan of every page) are counted only when needed.
    return free >= pages_needed || free + prefix_->FreeablePages() >= pages_needed;
  };
  while (budget > 0 && (!swapped_.empty() || next_waiting < waiting_.size())) {
    Request* waiting = next_waiting < waiting_.size() ? waiting_[next_waiting] : nullptr;
    const bool resume = !swapped_.empty() && (!waiting || !Before(waiting, swapped_.front()));
    Request* r = resume ? swapped_.front() : waiting;
    if (resume) {
      if (!leaves_claims(std::max(r->swap_page_count, pages_for(r->total() + 1)))) break;
      if (!SwapIn(*r)) break;
      swapped_.pop_front();
    } else {
      if (const int64_t boundary = prefix_ ? AwaitsSharedPrefix(*r, planned) : 0; boundary > 0) {
        ++claimed_slots;
        claimed_pages += pages_for(r->total() + 1) - boundary / config_.page_size;
        // Each look is a lookup and a comparison with the prefills running: a queue of requests
        // sharing one long system prompt is looked at a few at a time, the rest wait their turn.
        if (++next_waiting == kMaxPassedOver) break;
        continue;
      }
      if (!leaves_claims(pages_for(r->total() + 1))) break;
      if (!AdmitWaiting(*r)) break;
      if (!ReserveForAdmission(*r, planned)) {
        BackToQueue(*r);
        break;
      }
      if (prefix_) prefix_->Count(r->cached_tokens);
    }
    try_run(*r);
    if (!is_planned(r)) break;  // it could not run (and may be preempted again): next step
  }
  // 4. The engine's view of the plan.
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const Request& r = *plan.seqs[i].request;
    SequenceStep s;
    s.kda_slot = r.kda_slot;
    s.pages = r.pages;
    s.pos0 = r.computed;
    s.tokens = plan.tokens[i];
    s.logits = plan.seqs[i].sample ? LogitsWanted::kLast : LogitsWanted::kNone;
    plan.batch.push_back(s);
  }
  return plan;
}

}  // namespace kimi::sched
