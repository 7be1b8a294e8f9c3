#include "scheduler/scheduler.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::sched {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

Scheduler::Scheduler(const ModelConfig& model, const SchedulerConfig& config, EngineState state,
                     StateOpSink* ops)
    : model_(model),
      config_(config),
      state_(state),
      ops_(ops),
      slots_(std::min(config.max_running, state.kda ? state.kda->num_slots() : config.max_running)),
      pages_(std::min(config.num_pages, state.kv ? state.kv->num_pages() : config.num_pages)),
      token_budget_(config.token_budget) {
  if (config_.max_context <= 0) config_.max_context = model.max_context;
  if (state.kv) config_.page_size = state.kv->page_size();
  // A sequence cannot outgrow the KV pool even alone: past it, preempting itself for pages would
  // swap it out and back in every step without progress. It ends at the limit instead (LENGTH).
  config_.max_context =
      std::min(config_.max_context, PoolContextLimit(pages_.capacity(), config_.page_size));
  if (config_.prefix_interval > 0) {
    assert(config_.prefix_interval % config_.chunk_grid == 0 &&
           config_.prefix_interval % config_.page_size == 0 && "validated by the caller");
    const int64_t snapshot_bytes =
        state.kda ? state.kda->SlotFloats() * static_cast<int64_t>(sizeof(float)) : 0;
    prefix_ = std::make_unique<PrefixCache>(
        config_.prefix_interval, config_.page_size, config_.prefix_cache_bytes, snapshot_bytes,
        &pages_, [this](int64_t handle) { ops_->Apply({StateOpKind::kDrop, -1, handle, {}}); });
  }
}

Scheduler::~Scheduler() {
  // The prefix cache holds page refs; drop it before the allocator it points to.
  prefix_.reset();
}

int64_t Scheduler::Concurrency() const {
  // KDA slots, the KV pages a request of a typical length needs, the AttnRes per-step budget.
  const int64_t typical = std::min<int64_t>(config_.max_context, 4096);
  const int64_t pages_each = (typical + config_.page_size - 1) / config_.page_size;
  return std::min({slots_.capacity(), pages_.capacity() / std::max<int64_t>(1, pages_each),
                   token_budget_});
}

absl::Status Scheduler::Validate(const RequestSpec& spec) const {
  if (spec.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  const int64_t len = static_cast<int64_t>(spec.prompt.size());
  if (len >= config_.max_context) {
    const bool pool = config_.max_context == PoolContextLimit(pages_.capacity(), config_.page_size);
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", len, " tokens; the context limit is ", config_.max_context,
                     pool ? absl::StrCat(" (what the KV pool's ", pages_.capacity(), " pages of ",
                                         config_.page_size, " positions hold)")
                          : ""));
  }
  if (spec.max_tokens <= 0) return absl::InvalidArgumentError("max_tokens must be positive");
  return absl::OkStatus();
}

absl::Status Scheduler::Add(RequestSpec spec) {
  if (absl::Status s = Validate(spec); !s.ok()) return s;
  // Waiting requests take the free slots at the next step; up to max_waiting wait beyond them.
  if (static_cast<int64_t>(waiting_.size()) - slots_.free() >= config_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat("queue full (", config_.max_waiting,
                                                     " requests waiting)"));
  }
  if (requests_.count(spec.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id \"", spec.id, "\" is in use"));
  }
  auto r = std::make_unique<Request>();
  r->spec = std::move(spec);
  r->arrival = next_arrival_++;
  r->arrived = Clock::now();
  waiting_.push_back(r.get());
  requests_[r->spec.id] = std::move(r);
  return absl::OkStatus();
}

bool Scheduler::Cancel(const std::string& id, const std::string& reason) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  it->second->cancel = true;
  it->second->cancel_reason = reason;
  return true;
}

void Scheduler::Release(Request& r) {
  if (r.kda_slot >= 0) slots_.Release(r.kda_slot);
  r.kda_slot = -1;
  for (int32_t p : r.pages) pages_.Unref(p);
  r.pages.clear();
  for (int64_t* h : {&r.swap_slot, &r.swap_pages}) {
    if (*h >= 0) ops_->Apply({StateOpKind::kDrop, -1, *h, {}});
    *h = -1;
  }
}

RequestEvent Scheduler::Finished(Request& r, FinishReason reason, const std::string& detail) {
  Release(r);
  r.state = RequestState::kFinished;
  RequestEvent e;
  e.id = r.spec.id;
  e.finish = reason;
  e.detail = detail;
  e.prompt_tokens = static_cast<int64_t>(r.spec.prompt.size());
  e.completion_tokens = static_cast<int64_t>(r.output_ids.size());
  auto drop = [&](auto& list) {
    list.erase(std::remove(list.begin(), list.end(), &r), list.end());
  };
  drop(waiting_);
  drop(running_);
  drop(swapped_);
  ++counters_.finished;
  requests_.erase(r.spec.id);  // r is gone after this line
  return e;
}

std::vector<RequestEvent> Scheduler::Finish(const std::string& id, FinishReason reason,
                                            const std::string& detail) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return {Finished(*it->second, reason, detail)};
}

std::vector<RequestEvent> Scheduler::FinishAll(FinishReason reason, const std::string& detail) {
  std::vector<RequestEvent> events;
  while (!requests_.empty()) events.push_back(Finished(*requests_.begin()->second, reason, detail));
  return events;
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats s = counters_;
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.running = static_cast<int64_t>(running_.size());
  s.swapped = static_cast<int64_t>(swapped_.size());
  s.slots_used = slots_.used();
  s.slots_total = slots_.capacity();
  s.pages_used = pages_.used();
  s.pages_total = pages_.capacity();
  // Pages no running request holds are the prefix cache's alone (waiting requests hold none, and
  // swapped ones hold host copies). Counted with a bitmap of the pool (a bit a page), every step:
  // cheaper than sorting the running requests' page lists.
  std::vector<uint64_t> held(static_cast<size_t>((s.pages_total + 63) / 64), 0);
  int64_t distinct = 0;
  for (const Request* r : running_) {
    for (int32_t p : r->pages) {
      uint64_t& word = held[static_cast<size_t>(p) / 64];
      const uint64_t bit = uint64_t{1} << (p % 64);
      distinct += (word & bit) == 0;
      word |= bit;
    }
  }
  s.pages_cached = s.pages_used - distinct;
  s.attn_res_bytes_total = AttnResCacheBytes(model_, token_budget_);
  // The block cache lives for a step: with nothing running the last step's figure is stale.
  if (running_.empty()) s.attn_res_bytes_used = 0;
  if (prefix_) {
    s.prefix_queries = prefix_->queries();
    s.prefix_hits = prefix_->hits();
    s.prefix_saved_tokens = prefix_->saved_tokens();
    s.prefix_entries = prefix_->entries();
    s.prefix_bytes = prefix_->bytes();
  }
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  std::vector<int32_t> holders(pages_.capacity(), 0);
  std::vector<char> slot_seen(slots_.capacity(), 0);
  int64_t slots_held = 0;
  for (const auto& [id, r] : requests_) {
    const bool running = r->state == RequestState::kRunning;
    if (running != (r->kda_slot >= 0)) {
      return absl::InternalError(absl::StrCat(id, ": slot ", r->kda_slot, " in state ",
                                              static_cast<int>(r->state)));
    }
    if (r->kda_slot >= 0) {
      if (slot_seen[r->kda_slot]++) {
        return absl::InternalError(absl::StrCat("slot ", r->kda_slot, " held twice"));
      }
      ++slots_held;
    }
    if (!running && !r->pages.empty()) return absl::InternalError(id + ": pages while not running");
    for (int32_t p : r->pages) ++holders[p];
    const int64_t need = (r->computed + config_.page_size - 1) / config_.page_size;
    if (running && static_cast<int64_t>(r->pages.size()) < need) {
      return absl::InternalError(absl::StrCat(id, ": ", r->pages.size(), " pages for ",
                                              r->computed, " computed tokens"));
    }
  }
  if (prefix_) prefix_->CountPageRefs(holders);
  for (int64_t p = 0; p < pages_.capacity(); ++p) {
    if (holders[p] != pages_.refs(static_cast<int32_t>(p))) {
      return absl::InternalError(absl::StrCat("page ", p, " has ", pages_.refs(p), " refs but ",
                                              holders[p], " holders"));
    }
  }
  if (slots_held != slots_.used()) {
    return absl::InternalError(absl::StrCat(slots_held, " slots held, allocator says ",
                                            slots_.used()));
  }
  if (static_cast<int64_t>(running_.size()) != slots_held) {
    return absl::InternalError("running list and slot holders differ");
  }
  return absl::OkStatus();
}

std::vector<RequestEvent> Scheduler::Update(StepPlan& plan, const StepOutput& out) {
  std::vector<RequestEvent> events;
  counters_.attn_res_bytes_used = AttnResCacheBytes(model_, plan.num_tokens);
  for (const PlannedSeq& s : plan.seqs) {
    s.request->computed += s.count;
    MaybeSnapshot(*s.request);
  }
  // Rows are sampled in parallel on the kernels' pool (idle between engine steps, and called from
  // the engine thread as its contract asks): each draw depends only on its own request, so the
  // split cannot change a token. Each thread names the row it samples next, which SampleToken
  // prefetches while it works on the current one.
  const int64_t n = static_cast<int64_t>(plan.seqs.size());
  const size_t vocab = static_cast<size_t>(out.vocab);
  const auto row_of = [&](int64_t i) {
    return std::span<const float>(out.logits.data() + out.first_row[i] * out.vocab, vocab);
  };
  std::vector<TokenChoice> choices(plan.seqs.size());
  cpu::ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end && !plan.seqs[i].sample) ++i;
    while (i < end) {
      int64_t next = i + 1;
      while (next < end && !plan.seqs[next].sample) ++next;
      const Request& r = *plan.seqs[i].request;
      choices[i] = SampleToken(row_of(i), r.spec.sampling, r.spec.prompt, r.output_ids,
                               static_cast<uint64_t>(r.output_ids.size()),
                               next < end ? row_of(next) : std::span<const float>());
      i = next;
    }
  });
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.seqs[i].sample) continue;
    Request& r = *plan.seqs[i].request;
    TokenChoice choice = std::move(choices[i]);
    const int32_t tok = choice.token;
    r.output_ids.push_back(tok);
    r.output.push_back(choice);
    RequestEvent e;
    e.id = r.spec.id;
    e.tokens.push_back(std::move(choice));
    const bool stop_id =
        std::find(r.spec.stop_token_ids.begin(), r.spec.stop_token_ids.end(), tok) !=
        r.spec.stop_token_ids.end();
    if (stop_id) {
      RequestEvent done = Finished(r, FinishReason::kStop, "stop token");
      done.tokens = std::move(e.tokens);
      done.stop_token = true;
      events.push_back(std::move(done));
    } else if (static_cast<int64_t>(r.output_ids.size()) >= r.spec.max_tokens) {
      RequestEvent done = Finished(r, FinishReason::kLength, "max_tokens reached");
      done.tokens = std::move(e.tokens);
      events.push_back(std::move(done));
    } else if (r.total() >= config_.max_context) {
      RequestEvent done = Finished(r, FinishReason::kLength, "context limit reached");
      done.tokens = std::move(e.tokens);
      events.push_back(std::move(done));
    } else {
      events.push_back(std::move(e));
    }
  }
  return events;
}

void Scheduler::MaybeSnapshot(Request& r) {
  if (!prefix_ || !state_.kda || r.computed == 0 || r.computed % prefix_->interval() != 0) return;
  std::vector<int32_t> tokens(r.computed);
  for (int64_t i = 0; i < r.computed; ++i) tokens[i] = r.token_at(i);
  if (!prefix_->Wants(tokens)) return;
  const int64_t handle = NewHandle();
  ops_->Apply({StateOpKind::kSaveSlot, r.kda_slot, handle, {}});
  prefix_->Insert(tokens, handle, r.pages);
}

}  // namespace kimi::sched
