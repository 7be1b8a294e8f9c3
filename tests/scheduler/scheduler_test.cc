#include "scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/scheduler/fake_model.h"

namespace kimi::sched {
namespace {

using testing::FakeConfig;
using testing::FakeStep;

struct Fixture {
  ModelConfig model = FakeConfig();
  KdaStatePool kda;
  MlaKvCache kv;
  StateStore store;
  LocalStateSink sink;
  Scheduler sched;
  Fixture(const SchedulerConfig& c)
      : kda(model, c.max_running),
        kv(model, c.num_pages, c.page_size),
        store(&kda, &kv),
        sink(&store),
        sched(model, c, {&kda, &kv}, &sink) {}

  RequestSpec Spec(const std::string& id, int64_t prompt_len, int32_t max_tokens,
                   int32_t priority = 0) {
    RequestSpec s;
    s.id = id;
    for (int64_t i = 0; i < prompt_len; ++i) s.prompt.push_back(static_cast<int32_t>(i % 30));
    s.max_tokens = max_tokens;
    s.sampling.temperature = 0.0f;
    s.priority = priority;
    return s;
  }
  std::vector<std::string> planned_ids;  // of the last step, recorded before Update
  // One step: schedule, fake engine, update. Returns all events. Requests that finished in the
  // step are gone afterwards: read `planned_ids`, not the plan's request pointers.
  std::vector<RequestEvent> Step(StepPlan* plan_out = nullptr) {
    std::vector<RequestEvent> events;
    StepPlan plan = sched.Schedule(&events);
    planned_ids.clear();
    for (const PlannedSeq& s : plan.seqs) planned_ids.push_back(s.request->spec.id);
    EXPECT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
    if (!plan.empty()) {
      auto more = sched.Update(plan, FakeStep(plan, model.vocab));
      events.insert(events.end(), more.begin(), more.end());
    }
    EXPECT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
    if (plan_out) *plan_out = std::move(plan);
    return events;
  }
};

SchedulerConfig Small() {
  SchedulerConfig c;
  c.max_running = 4;
  c.num_pages = 64;
  c.page_size = 16;
  c.token_budget = 128;
  c.max_waiting = 8;
  c.prefix_interval = 0;
  return c;
}

// A long prompt is prefilled in grid-aligned chunks while a running request keeps decoding.
TEST(Scheduler, LongPromptDoesNotStallDecodes) {
  Fixture f(Small());
  ASSERT_TRUE(f.sched.Add(f.Spec("short", 5, 50)).ok());
  f.Step();  // prefill of "short" + its first token
  ASSERT_TRUE(f.sched.Add(f.Spec("long", 300, 2)).ok());
  std::vector<int64_t> long_chunks;
  for (int i = 0; i < 4; ++i) {
    StepPlan plan;
    f.Step(&plan);
    bool decode_seen = false;
    for (const PlannedSeq& s : plan.seqs) {
      if (s.request->spec.id == "short") decode_seen = s.count == 1;
      if (s.request->spec.id == "long") long_chunks.push_back(s.count);
    }
    EXPECT_TRUE(decode_seen) << "step " << i;
    EXPECT_LE(plan.num_tokens, 128);
  }
  // Budget 128 minus one decode = 127, rounded down to the 64 grid: 64-token chunks; the last
  // chunk finishes the prompt and may end off the grid (300 = 3 x 64 + 108).
  ASSERT_EQ(long_chunks.size(), 4u);
  EXPECT_EQ(long_chunks[0], 64);
  EXPECT_EQ(long_chunks[2], 64);
  EXPECT_EQ(long_chunks[3], 108);
}

TEST(Scheduler, GreedyTokensAndFinishReasons) {
  Fixture f(Small());
  ASSERT_TRUE(f.sched.Add(f.Spec("a", 10, 3)).ok());
  std::vector<int32_t> tokens;
  RequestEvent last;
  for (int i = 0; i < 10 && f.sched.HasWork(); ++i) {
    for (auto& e : f.Step()) {
      for (auto& t : e.tokens) tokens.push_back(t.token);
      last = e;
    }
  }
  // The fake logits predict the index of the next position: 10, 11, 12.
  EXPECT_EQ(tokens, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(last.finish, FinishReason::kLength);
  EXPECT_EQ(last.completion_tokens, 3);
  EXPECT_EQ(last.prompt_tokens, 10);

  RequestSpec s = f.Spec("b", 10, 100);
  s.stop_token_ids = {11};
  ASSERT_TRUE(f.sched.Add(s).ok());
  tokens.clear();
  for (int i = 0; i < 10 && f.sched.HasWork(); ++i) {
    for (auto& e : f.Step()) {
      for (auto& t : e.tokens) tokens.push_back(t.token);
      last = e;
    }
  }
  EXPECT_EQ(tokens, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(last.finish, FinishReason::kStop);
}

TEST(Scheduler, QueueBoundAndValidation) {
  SchedulerConfig c = Small();
  c.max_context = 100;
  Fixture f(c);
  // 4 free slots (the requests that start at the next step) and 8 waiting beyond them.
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(f.sched.Add(f.Spec("r" + std::to_string(i), 5, 5)).ok()) << i;
  }
  absl::Status s = f.sched.Add(f.Spec("over", 5, 5));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("queue full"), std::string::npos);
  EXPECT_EQ(f.sched.Add(f.Spec("r0", 5, 5)).code(), absl::StatusCode::kResourceExhausted);
  Fixture g(c);
  EXPECT_EQ(g.sched.Add(f.Spec("long", 100, 5)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.sched.Add(f.Spec("empty", 0, 5)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(g.sched.Add(f.Spec("x", 5, 5)).ok());
  EXPECT_EQ(g.sched.Add(f.Spec("x", 5, 5)).code(), absl::StatusCode::kAlreadyExists);
}

TEST(Scheduler, CancelFreesStateAtTheNextStep) {
  Fixture f(Small());
  ASSERT_TRUE(f.sched.Add(f.Spec("a", 40, 100)).ok());
  f.Step();
  EXPECT_EQ(f.sched.Stats().slots_used, 1);
  EXPECT_GT(f.sched.Stats().pages_used, 0);
  EXPECT_TRUE(f.sched.Cancel("a"));
  const auto events = f.Step();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kCancelled);
  EXPECT_EQ(f.sched.Stats().slots_used, 0);
  EXPECT_EQ(f.sched.Stats().pages_used, 0);
  EXPECT_FALSE(f.sched.Cancel("a"));
}

TEST(Scheduler, DeadlineEndsTheRequest) {
  Fixture f(Small());
  RequestSpec s = f.Spec("a", 5, 100);
  s.deadline = Clock::now() - std::chrono::seconds(1);
  ASSERT_TRUE(f.sched.Add(s).ok());
  const auto events = f.Step();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kCancelled);
  EXPECT_EQ(events[0].detail, "deadline exceeded");
}

TEST(Scheduler, PriorityOrdersAdmission) {
  SchedulerConfig c = Small();
  c.max_running = 1;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("late-low", 5, 1, 5)).ok());
  ASSERT_TRUE(f.sched.Add(f.Spec("urgent", 5, 1, 0)).ok());
  f.Step();
  EXPECT_EQ(f.planned_ids, std::vector<std::string>{"urgent"});
  f.Step();
  EXPECT_EQ(f.planned_ids, std::vector<std::string>{"late-low"});
}

// A request of higher priority that cannot start (no slot) takes the place of a running one of
// lower priority, which resumes afterwards where it was; both policies. Before, it waited for the
// lower one to finish: admission could only preempt requests not yet planned, and every running
// one was.
TEST(Scheduler, PriorityPreemptsLowerRequests) {
  for (PreemptPolicy policy : {PreemptPolicy(SwapToHost{}), PreemptPolicy(Recompute{})}) {
    SchedulerConfig c = Small();
    c.max_running = 1;
    c.preempt = policy;
    Fixture f(c);
    ASSERT_TRUE(f.sched.Add(f.Spec("low", 8, 60, 5)).ok());
    std::map<std::string, std::vector<int32_t>> tokens;
    auto step = [&] {
      for (auto& e : f.Step()) {
        for (auto& t : e.tokens) tokens[e.id].push_back(t.token);
      }
    };
    for (int i = 0; i < 5; ++i) step();
    ASSERT_TRUE(f.sched.Add(f.Spec("urgent", 8, 4, 0)).ok());
    step();
    EXPECT_EQ(f.planned_ids, std::vector<std::string>{"urgent"});
    for (int i = 0; i < 200 && f.sched.HasWork(); ++i) step();
    EXPECT_EQ(tokens["urgent"].size(), 4u);
    ASSERT_EQ(tokens["low"].size(), 60u);
    for (size_t i = 0; i < 60; ++i) EXPECT_EQ(tokens["low"][i], (8 + i) % 32);
  }
}

// Swapped and waiting requests start in one order: with a rule for each, swapped = [A (priority
// 5, first), B (0)] and waiting = [W (1)] blocked each other (A's place barred W's resumption of
// the swapped, B barred W's admission) and nothing ran again.
TEST(Scheduler, SwappedAndWaitingRequestsNeverBlockEachOther) {
  SchedulerConfig c = Small();
  c.max_running = 1;
  Fixture f(c);
  std::map<std::string, size_t> tokens;
  auto step = [&] {
    for (auto& e : f.Step()) tokens[e.id] += e.tokens.size();
  };
  ASSERT_TRUE(f.sched.Add(f.Spec("a5", 8, 30, 5)).ok());
  step();
  ASSERT_TRUE(f.sched.Add(f.Spec("b0", 8, 30, 0)).ok());
  step();
  ASSERT_TRUE(f.sched.Add(f.Spec("c-1", 8, 10, -1)).ok());
  step();
  ASSERT_TRUE(f.sched.Add(f.Spec("w1", 8, 10, 1)).ok());
  for (int i = 0; i < 300 && f.sched.HasWork(); ++i) step();
  EXPECT_FALSE(f.sched.HasWork());
  EXPECT_EQ(tokens["a5"], 30u);
  EXPECT_EQ(tokens["b0"], 30u);
  EXPECT_EQ(tokens["c-1"], 10u);
  EXPECT_EQ(tokens["w1"], 10u);
}

// A request of higher priority that lacks pages takes those only the prefix cache holds before it
// preempts anyone: counted without them, a running request was swapped out while the cache kept
// 12 pages it would have given up.
TEST(Scheduler, PriorityTakesCachePagesBeforePreempting) {
  SchedulerConfig c = Small();
  c.num_pages = 20;
  c.prefix_interval = 64;
  c.prefix_cache_bytes = int64_t{1} << 30;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("cached", 192, 1)).ok());
  for (int i = 0; i < 20 && f.sched.HasWork(); ++i) f.Step();
  ASSERT_GT(f.sched.Stats().pages_cached, 0);
  ASSERT_TRUE(f.sched.Add(f.Spec("low", 40, 100, 5)).ok());
  f.Step();
  f.Step();
  ASSERT_LT(f.sched.Stats().pages_total - f.sched.Stats().pages_used,
            7);  // free: fewer than needed
  ASSERT_TRUE(f.sched.Add(f.Spec("urgent", 100, 5, 0)).ok());
  f.Step();
  EXPECT_EQ(f.sched.Stats().preempt_swap, 0);
  EXPECT_EQ(std::count(f.planned_ids.begin(), f.planned_ids.end(), "urgent"), 1);
  EXPECT_EQ(std::count(f.planned_ids.begin(), f.planned_ids.end(), "low"), 1);
}

// Victims are chosen by the same aged priority that orders the queue: a long-running request of
// priority 5 whose age outranks a new one of priority 0 keeps running. Chosen by the plain
// priority, it was preempted (recompute), re-admitted ahead by its age, and preempted again,
// every step, and the new one never ran.
TEST(Scheduler, AgingAndPreemptionAgree) {
  SchedulerConfig c = Small();
  c.max_running = 1;
  c.preempt = Recompute{};
  c.aging_seconds = 0.01;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("old5", 8, 40, 5)).ok());
  f.Step();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(f.sched.Add(f.Spec("new0", 8, 5, 0)).ok());
  for (int i = 0; i < 300 && f.sched.HasWork(); ++i) f.Step();
  EXPECT_FALSE(f.sched.HasWork());
  EXPECT_LE(f.sched.Stats().preempt_recompute, 1);
}

// When pages run out, the victim is the lowest priority whichever was admitted first: the request
// of priority 0 admitted second never stalls while the one of priority 5 runs. Both cross a page
// boundary in the same step with one page free (prompts of 40 and 41, a step apart, 7 pages):
// planned in admission order, the first took it and the second preempted itself.
TEST(Scheduler, PagesGoToTheHigherPriorityFirst) {
  SchedulerConfig c = Small();
  c.num_pages = 7;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("low", 40, 40, 5)).ok());
  f.Step();
  ASSERT_TRUE(f.sched.Add(f.Spec("high", 41, 40, 0)).ok());
  int high_stalled = 0;
  for (int i = 0; i < 300 && f.sched.HasWork(); ++i) {
    f.Step();
    const bool high = std::count(f.planned_ids.begin(), f.planned_ids.end(), "high") > 0;
    const bool low = std::count(f.planned_ids.begin(), f.planned_ids.end(), "low") > 0;
    if (low && !high && f.sched.Stats().running + f.sched.Stats().swapped == 2) ++high_stalled;
  }
  EXPECT_FALSE(f.sched.HasWork());
  EXPECT_EQ(high_stalled, 0);
  EXPECT_GE(f.sched.Stats().preempt_swap, 1);
}

// A request swapped out at a page boundary comes back only when the page its next token needs is
// free too: with room for its own pages only, it came back and swapped itself out again at once,
// every step until the other request finished.
TEST(Scheduler, SwapInWaitsForTheNextPage) {
  SchedulerConfig c = Small();
  c.num_pages = 7;
  Fixture f(c);
  std::map<std::string, std::vector<int32_t>> tokens;
  auto step = [&] {
    for (auto& e : f.Step()) {
      for (auto& t : e.tokens) tokens[e.id].push_back(t.token);
    }
  };
  ASSERT_TRUE(f.sched.Add(f.Spec("a", 40, 40)).ok());
  step();
  ASSERT_TRUE(f.sched.Add(f.Spec("b", 41, 40)).ok());
  for (int i = 0; i < 300 && f.sched.HasWork(); ++i) step();
  EXPECT_FALSE(f.sched.HasWork());
  EXPECT_EQ(tokens["a"].size(), 40u);
  EXPECT_EQ(tokens["b"].size(), 40u);
  EXPECT_LE(f.sched.Stats().preempt_swap, 2);
}

// When pages run out, the latest lower-priority request is swapped to host memory and later
// resumes with its state restored exactly.
TEST(Scheduler, SwapPreemptionRestoresState) {
  SchedulerConfig c = Small();
  c.num_pages = 6;  // 96 positions
  c.page_size = 16;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("first", 40, 40)).ok());
  ASSERT_TRUE(f.sched.Add(f.Spec("second", 40, 40)).ok());
  int64_t swaps = 0;
  std::map<std::string, std::vector<int32_t>> tokens;
  for (int i = 0; i < 200 && f.sched.HasWork(); ++i) {
    for (auto& e : f.Step()) {
      for (auto& t : e.tokens) tokens[e.id].push_back(t.token);
    }
    swaps = f.sched.Stats().preempt_swap;
  }
  EXPECT_GE(swaps, 1);
  EXPECT_EQ(tokens["first"].size(), 40u);
  EXPECT_EQ(tokens["second"].size(), 40u);
  // Greedy fake tokens depend only on positions: a swapped request continues where it left.
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(tokens["second"][i], (40 + i) % 32);
}

// A request the KV pool cannot hold to its max_tokens ends where the pool is full (LENGTH). It
// used to preempt itself for pages, and swap out and back in every step without progress.
TEST(Scheduler, ALoneRequestEndsAtWhatThePoolHolds) {
  for (PreemptPolicy policy : {PreemptPolicy(SwapToHost{}), PreemptPolicy(Recompute{})}) {
    SchedulerConfig c = Small();
    c.num_pages = 6;  // 96 positions
    c.preempt = policy;
    Fixture f(c);
    ASSERT_TRUE(f.sched.Add(f.Spec("long", 40, 100)).ok());
    std::vector<int32_t> tokens;
    RequestEvent last;
    for (int i = 0; i < 200 && f.sched.HasWork(); ++i) {
      for (auto& e : f.Step()) {
        for (auto& t : e.tokens) tokens.push_back(t.token);
        last = e;
      }
    }
    EXPECT_FALSE(f.sched.HasWork());
    EXPECT_EQ(last.finish, FinishReason::kLength);
    EXPECT_EQ(tokens.size(), 56u);  // 40 + 56 = the 96 positions
    EXPECT_EQ(f.sched.Stats().preempt_swap + f.sched.Stats().preempt_recompute, 0);
    EXPECT_EQ(f.sched.Concurrency(), 1);

    const absl::Status too_long = f.sched.Add(f.Spec("too-long", 96, 1));
    EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(too_long.message(),
              "prompt has 96 tokens; the context limit is 96 (what the KV pool's 6 pages of 16 "
              "positions hold)");
    EXPECT_TRUE(f.sched.Add(f.Spec("fits", 95, 1)).ok());
  }
}

// Admission takes pages for a request's whole known tokens. Admitted against pages that running
// requests need next, it (or they) were preempted at the next page boundary, and under recompute
// each time lost the work: twelve requests of 300 + 400 tokens in a 3264-position pool ran 44,828
// tokens for 8,400 of work, with 569 preemptions; now 12,572 with 10 (a decode that outgrows the
// pool still preempts the latest request, which recomputes once).
TEST(Scheduler, RecomputeDoesNotThrash) {
  SchedulerConfig c = Small();
  c.num_pages = 204;
  c.max_running = 16;
  c.max_waiting = 64;
  c.token_budget = 512;
  c.preempt = Recompute{};
  Fixture f(c);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(f.sched.Add(f.Spec("r" + std::to_string(i), 300, 400)).ok());
  }
  int64_t tokens_run = 0, finished = 0;
  for (int i = 0; i < 5000 && f.sched.HasWork(); ++i) {
    StepPlan plan;
    for (auto& e : f.Step(&plan)) finished += e.finish != FinishReason::kNone;
    tokens_run += plan.num_tokens;
  }
  EXPECT_EQ(finished, 12);
  EXPECT_LE(tokens_run, 12 * 700 * 8 / 5);  // within 1.6x the work
  EXPECT_LE(f.sched.Stats().preempt_recompute, 12);
}

TEST(Scheduler, RecomputePreemptionFinishesEverything) {
  SchedulerConfig c = Small();
  c.num_pages = 6;
  c.preempt = Recompute{};
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("first", 40, 40)).ok());
  ASSERT_TRUE(f.sched.Add(f.Spec("second", 40, 40)).ok());
  std::map<std::string, std::vector<int32_t>> tokens;
  for (int i = 0; i < 400 && f.sched.HasWork(); ++i) {
    for (auto& e : f.Step()) {
      for (auto& t : e.tokens) tokens[e.id].push_back(t.token);
    }
  }
  EXPECT_FALSE(f.sched.HasWork());
  EXPECT_GE(f.sched.Stats().preempt_recompute, 1);
  for (const char* id : {"first", "second"}) {
    ASSERT_EQ(tokens[id].size(), 40u);
    for (size_t i = 0; i < 40; ++i) EXPECT_EQ(tokens[id][i], (40 + i) % 32);
  }
}

// Requests that share a prompt and arrive together (an OpenAI request's n choices) prefill it once:
// the others wait for the first to snapshot the deepest shared boundary and restore it. Their
// tokens are those of a run without the cache.
TEST(Scheduler, RequestsSharingAPromptPrefillItOnce) {
  for (const int64_t interval : {int64_t{0}, int64_t{64}}) {
    SchedulerConfig c = Small();
    c.num_pages = 128;
    c.prefix_interval = interval;
    Fixture f(c);
    for (const char* id : {"a", "b", "c", "d"}) ASSERT_TRUE(f.sched.Add(f.Spec(id, 300, 4)).ok());
    int64_t computed = 0;
    std::map<std::string, std::vector<int32_t>> tokens;
    for (int step = 0; step < 100 && f.sched.HasWork(); ++step) {
      StepPlan plan;
      for (const RequestEvent& e : f.Step(&plan)) {
        for (const TokenChoice& t : e.tokens) tokens[e.id].push_back(t.token);
      }
      computed += plan.num_tokens;
    }
    ASSERT_FALSE(f.sched.HasWork());
    ASSERT_EQ(tokens.size(), 4u);
    for (const auto& [id, t] : tokens) EXPECT_EQ(t, tokens["a"]) << id;
    // Four prompts of 300 and three decode steps each; with the cache, three of them restore 256
    // tokens (the deepest 64-token boundary short of their last prompt token) and prefill 44.
    const int64_t decodes = 4 * 3;
    if (interval == 0) {
      EXPECT_EQ(computed, 4 * 300 + decodes);
    } else {
      EXPECT_EQ(computed, 300 + 3 * 44 + decodes);
      EXPECT_EQ(f.sched.Stats().prefix_saved_tokens, 3 * 256);
    }
  }
}

// A request waiting for a shared prefix holds back no other: one with another prompt behind it
// starts in the same step as the first.
TEST(Scheduler, AwaitingASharedPrefixDoesNotBlockOthers) {
  SchedulerConfig c = Small();
  c.num_pages = 128;
  c.prefix_interval = 64;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("first", 300, 2)).ok());
  ASSERT_TRUE(f.sched.Add(f.Spec("same", 300, 2)).ok());
  RequestSpec other = f.Spec("other", 40, 2);
  for (int32_t& t : other.prompt) t = (t + 7) % 30;
  ASSERT_TRUE(f.sched.Add(other).ok());
  f.Step();
  EXPECT_EQ(f.planned_ids, (std::vector<std::string>{"first", "other"}));
  // "same" starts once "first" has passed the deepest boundary they share (256), restoring it.
  int steps = 1;
  while (std::find(f.planned_ids.begin(), f.planned_ids.end(), "same") == f.planned_ids.end()) {
    ASSERT_LT(++steps, 20);
    f.Step();
  }
  EXPECT_EQ(f.sched.Stats().prefix_saved_tokens, 256);
}

// A prompt other than Spec's (which every Spec shares).
RequestSpec Other(Fixture& f, const std::string& id, int64_t prompt_len, int32_t max_tokens,
                  int32_t priority = 0) {
  RequestSpec s = f.Spec(id, prompt_len, max_tokens, priority);
  for (int32_t& t : s.prompt) t = (t + 7) % 30;
  return s;
}

// Step at which each request got its first token.
std::map<std::string, int> FirstTokens(Fixture& f, int max_steps) {
  std::map<std::string, int> first;
  for (int step = 0; step < max_steps && f.sched.HasWork(); ++step) {
    for (const RequestEvent& e : f.Step()) {
      if (!e.tokens.empty() && !first.count(e.id)) first[e.id] = step;
    }
  }
  return first;
}

// A request passed over for a shared prefix keeps its place: one that arrived after it does not
// take the last slot meanwhile (it did, and the passed-over one waited ~200 steps for a slot).
TEST(Scheduler, APassedOverRequestKeepsItsPlace) {
  SchedulerConfig c = Small();
  c.max_running = 2;
  c.num_pages = 128;
  c.token_budget = 512;
  c.prefix_interval = 64;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("r", 300, 100)).ok());
  ASSERT_TRUE(f.sched.Add(f.Spec("w", 300, 100)).ok());
  ASSERT_TRUE(f.sched.Add(Other(f, "x", 300, 100)).ok());
  const std::map<std::string, int> first = FirstTokens(f, 1000);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_LE(first.at("w"), first.at("r") + 1);
  EXPECT_GT(first.at("x"), first.at("w") + 50);  // after a slot frees
}

// Only a request ranked ahead is waited for: a priority-0 request does not wait for a priority-5
// one that shares its prompt but gets no budget while priority-1 requests run (it waited for their
// whole prefill, ~50 steps, instead of preempting it).
TEST(Scheduler, APassedOverRequestWaitsOnlyForOneRankedAhead) {
  SchedulerConfig c = Small();
  c.max_running = 3;
  c.num_pages = 1024;
  c.prefix_interval = 64;
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("r", 300, 4, 5)).ok());
  f.Step();
  ASSERT_TRUE(f.sched.Add(Other(f, "d", 5, 2000, 1)).ok());
  RequestSpec p = Other(f, "p", 3000, 4, 1);
  for (int32_t& t : p.prompt) t = (t + 11) % 30;
  ASSERT_TRUE(f.sched.Add(p).ok());
  f.Step();
  ASSERT_TRUE(f.sched.Add(f.Spec("w", 300, 4, 0)).ok());
  int steps = 0;
  do {
    ASSERT_LT(++steps, 6) << "w not planned";
    f.Step();
  } while (std::find(f.planned_ids.begin(), f.planned_ids.end(), "w") == f.planned_ids.end());
}

// With a prefix cache too small to keep a snapshot through a step's insertions (at most one per
// running request), nobody waits for one: it could be evicted before it is used.
TEST(Scheduler, NoWaitForASnapshotTheCacheMayNotKeep) {
  SchedulerConfig c = Small();
  c.num_pages = 128;
  c.prefix_interval = 64;
  Fixture probe(c);
  c.prefix_cache_bytes = probe.kda.SlotFloats() * 4 * c.max_running;  // max_running snapshots
  Fixture f(c);
  ASSERT_TRUE(f.sched.Add(f.Spec("a", 300, 2)).ok());
  ASSERT_TRUE(f.sched.Add(f.Spec("b", 300, 2)).ok());
  f.Step();
  EXPECT_EQ(f.planned_ids, (std::vector<std::string>{"a", "b"}));
}

// Randomised request streams: invariants hold after every step, the budget is respected, and
// every admitted request terminates with a reason.
TEST(Scheduler, RandomStreamsKeepInvariants) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    std::mt19937 rng(seed);
    SchedulerConfig c = Small();
    c.max_running = 1 + rng() % 5;
    c.num_pages = 8 + rng() % 30;
    c.token_budget = 64 * (1 + rng() % 3);
    c.max_waiting = 64;
    c.preempt = rng() % 2 ? PreemptPolicy(SwapToHost{}) : PreemptPolicy(Recompute{});
    c.prefix_interval = rng() % 2 ? 64 : 0;
    Fixture f(c);
    std::map<std::string, FinishReason> finished;
    int added = 0;
    for (int step = 0; step < 3000; ++step) {
      if (added < 40 && rng() % 3 == 0) {
        RequestSpec s = f.Spec("q" + std::to_string(added), 1 + rng() % 150, 1 + rng() % 40,
                               static_cast<int32_t>(rng() % 3));
        if (rng() % 4 == 0) s.prompt.assign(128 + rng() % 20, 7);  // shared prefixes
        if (f.sched.Add(s).ok()) ++added;
      }
      if (rng() % 10 == 0 && added > 0) f.sched.Cancel("q" + std::to_string(rng() % added));
      StepPlan plan;
      for (auto& e : f.Step(&plan)) {
        if (e.finish != FinishReason::kNone) {
          ASSERT_FALSE(finished.count(e.id)) << e.id << " finished twice";
          finished[e.id] = e.finish;
        }
      }
      ASSERT_LE(plan.num_tokens, c.token_budget);
      if (added == 40 && !f.sched.HasWork()) break;
    }
    EXPECT_FALSE(f.sched.HasWork()) << "seed " << seed;
    EXPECT_EQ(static_cast<int>(finished.size()), added) << "seed " << seed;
    EXPECT_EQ(f.sched.Stats().slots_used, 0);
    // No snapshot leaks: host memory holds exactly the prefix cache's entries.
    EXPECT_EQ(f.store.snapshot_bytes(), f.sched.Stats().prefix_bytes) << "seed " << seed;
  }
}

TEST(Scheduler, ConcurrencyIsTheMinimumOverPools) {
  SchedulerConfig c = Small();
  c.max_running = 100;
  c.num_pages = 1024;  // 16384 positions: four 4096-token requests
  c.token_budget = 512;
  Fixture f(c);
  EXPECT_EQ(f.sched.Concurrency(), 4);
}

}  // namespace
}  // namespace kimi::sched
