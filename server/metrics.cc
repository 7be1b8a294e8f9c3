#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace kimi::server {

namespace p = ::prometheus;

namespace {

// Buckets for LLM serving: sub-millisecond steps and token gaps of small models up to requests of
// several minutes (4096 tokens at 50 ms a token take 205 s).
const p::Histogram::BucketBoundaries kLatency = {
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,  0.025, 0.05,  0.075, 0.1,
    0.15,    0.2,    0.3,   0.5,    0.75,  1.0,   1.5,   2.0,   3.0,   5.0,
    7.5,     10.0,   20.0,  30.0,   60.0,  120.0, 180.0, 300.0, 600.0};
const p::Histogram::BucketBoundaries kBatch = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<p::Registry> registry = std::make_shared<p::Registry>();
  std::unique_ptr<p::Exposer> exposer;
  std::mutex mu;
  sched::SchedulerStats last;  // for turning cumulative scheduler counts into increments

  p::Family<p::Histogram>* ttft;
  p::Family<p::Histogram>* itl;
  p::Family<p::Histogram>* e2e;
  p::Family<p::Histogram>* queue;
  p::Family<p::Histogram>* step;
  p::Family<p::Histogram>* batch;
  p::Family<p::Counter>* prompt_tokens;
  p::Family<p::Counter>* generation_tokens;
  p::Family<p::Counter>* requests;
  p::Family<p::Counter>* cancellations;
  p::Family<p::Counter>* rejected;
  p::Family<p::Counter>* auth_failures;
  p::Family<p::Counter>* prefix_queries;
  p::Family<p::Counter>* prefix_hits;
  p::Family<p::Counter>* prefix_saved;
  p::Family<p::Counter>* preemptions;
  p::Family<p::Counter>* step_tokens;
  p::Family<p::Gauge>* running;
  p::Family<p::Gauge>* waiting;
  p::Family<p::Gauge>* swapped;
  p::Family<p::Gauge>* kda_slots;
  p::Family<p::Gauge>* kv_pages;
  p::Family<p::Gauge>* attn_res;
  p::Family<p::Gauge>* overhead;
  p::Family<p::Gauge>* expert_imbalance;
  p::Family<p::Gauge>* rank_imbalance;
  p::Family<p::Counter>* replicated;
  p::Family<p::Gauge>* build;
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  auto& r = *m.registry;
  m.ttft = &p::BuildHistogram().Name("kimi_time_to_first_token_seconds")
                .Help("Time from request arrival to its first generated token").Register(r);
  m.itl = &p::BuildHistogram().Name("kimi_inter_token_latency_seconds")
               .Help("Time between consecutive generated tokens of a request").Register(r);
  m.e2e = &p::BuildHistogram().Name("kimi_e2e_request_latency_seconds")
               .Help("Time from request arrival to its last message").Register(r);
  m.queue = &p::BuildHistogram().Name("kimi_queue_time_seconds")
                 .Help("Time a request waited before its first step").Register(r);
  m.step = &p::BuildHistogram().Name("kimi_step_duration_seconds")
                .Help("Engine forward step time").Register(r);
  m.batch = &p::BuildHistogram().Name("kimi_batch_size")
                 .Help("Sequences per engine step").Register(r);
  m.prompt_tokens = &p::BuildCounter()
                         .Name("kimi_prompt_tokens_total")
                         .Help("Prompt tokens of finished requests (prefix-cache hits included)")
                         .Register(r);
  m.generation_tokens = &p::BuildCounter().Name("kimi_generation_tokens_total")
                             .Help("Generated tokens of finished requests").Register(r);
  m.requests = &p::BuildCounter().Name("kimi_requests_total")
                    .Help("Finished requests by finish reason").Register(r);
  m.cancellations = &p::BuildCounter().Name("kimi_request_cancellations_total")
                         .Help("Requests cancelled, by cause").Register(r);
  m.rejected = &p::BuildCounter().Name("kimi_requests_rejected_total")
                    .Help("Requests refused before running, by gRPC status").Register(r);
  m.auth_failures = &p::BuildCounter().Name("kimi_auth_failures_total")
                         .Help("Requests refused for a missing or wrong API key").Register(r);
  m.prefix_queries = &p::BuildCounter().Name("kimi_prefix_cache_queries_total")
                          .Help("Prefix-cache lookups").Register(r);
  m.prefix_hits = &p::BuildCounter().Name("kimi_prefix_cache_hits_total")
                       .Help("Prefix-cache lookups that restored a snapshot").Register(r);
  m.prefix_saved = &p::BuildCounter().Name("kimi_prefix_cache_saved_tokens_total")
                        .Help("Prompt tokens not recomputed thanks to the prefix cache")
                        .Register(r);
  m.preemptions = &p::BuildCounter().Name("kimi_preemptions_total")
                       .Help("Running requests preempted for memory, by kind").Register(r);
  m.step_tokens = &p::BuildCounter().Name("kimi_step_tokens_total")
                       .Help("Tokens computed by engine steps, by phase").Register(r);
  m.running = &p::BuildGauge().Name("kimi_requests_running").Help("Requests holding state")
                   .Register(r);
  m.waiting = &p::BuildGauge().Name("kimi_requests_waiting").Help("Requests queued").Register(r);
  m.swapped = &p::BuildGauge().Name("kimi_requests_swapped")
                   .Help("Requests preempted to host memory").Register(r);
  m.kda_slots = &p::BuildGauge().Name("kimi_kda_state_slots")
                     .Help("KDA state slots (state=used|total)").Register(r);
  m.kv_pages = &p::BuildGauge()
                    .Name("kimi_mla_kv_pages")
                    .Help(
                        "MLA KV cache pages (state=used|total; cached: of used, those only the "
                        "prefix cache holds, freed on demand)")
                    .Register(r);
  m.attn_res = &p::BuildGauge().Name("kimi_attn_res_cache_bytes")
                    .Help("AttnRes block cache bytes of the last step and its budget "
                          "(state=used|total)")
                    .Register(r);
  m.overhead = &p::BuildGauge().Name("kimi_scheduler_overhead_ratio")
                    .Help("Share of the last step spent outside the engine").Register(r);
  m.build = &p::BuildGauge().Name("kimi_build_info").Help("Build and model information")
                 .Register(r);
  m.expert_imbalance = &p::BuildGauge().Name("kimi_moe_expert_load_imbalance")
                            .Help("Last step's routed pairs of the busiest expert over the mean, "
                                  "per MoE layer")
                            .Register(r);
  m.rank_imbalance = &p::BuildGauge().Name("kimi_moe_rank_load_imbalance")
                          .Help("Expert parallel: last step's pairs on the busiest rank over the "
                                "mean, per MoE layer (placement=owner|balanced)")
                          .Register(r);
  m.replicated = &p::BuildCounter().Name("kimi_moe_replicated_experts_total")
                      .Help("Hot experts replicated on another rank for a step").Register(r);
  m.replicated->Add({});
  // Pre-create the labelled series dashboards query, so they exist before the first event.
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    m.requests->Add({{"finish_reason", reason}});
  }
  for (const char* kind : {"swap", "recompute"}) m.preemptions->Add({{"kind", kind}});
  for (const char* c : {"client_cancel", "deadline", "shutdown"}) {
    m.cancellations->Add({{"reason", c}});
  }
  for (const char* phase : {"prefill", "decode"}) m.step_tokens->Add({{"phase", phase}});
  for (const char* code : {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
                           "UNAUTHENTICATED"}) {
    m.rejected->Add({{"code", code}});
  }
  m.ttft->Add({}, kLatency);
  m.itl->Add({}, kLatency);
  m.e2e->Add({}, kLatency);
  m.queue->Add({}, kLatency);
  m.step->Add({}, kLatency);
  m.batch->Add({}, kBatch);
  m.prompt_tokens->Add({});
  m.generation_tokens->Add({});
  m.auth_failures->Add({});
  m.prefix_queries->Add({});
  m.prefix_hits->Add({});
  m.prefix_saved->Add({});
  m.running->Add({});
  m.waiting->Add({});
  m.swapped->Add({});
  m.overhead->Add({});
  for (const char* st : {"used", "total"}) {
    m.kda_slots->Add({{"state", st}});
    m.kv_pages->Add({{"state", st}});
    m.attn_res->Add({{"state", st}});
  }
  m.kv_pages->Add({{"state", "cached"}});
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        const std::string& model_name) {
  std::unique_ptr<Metrics> m(new Metrics);
  try {  // prometheus-cpp (CivetWeb) reports bind failures by exception
    // Several threads: a scraper holding a keep-alive connection must not block the others.
    m->impl_->exposer = std::make_unique<p::Exposer>(listen, /*num_threads=*/4);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ",
                                               e.what()));
  }
  m->impl_->exposer->RegisterCollectable(m->impl_->registry);
  m->impl_->build->Add({{"version", "0.1.0"}, {"model", model_name}}).Set(1);
  return m;
}

int Metrics::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? -1 : ports[0];
}

void Metrics::SetPools(const sched::SchedulerStats& s) {
  Impl& m = *impl_;
  m.running->Add({}).Set(static_cast<double>(s.running));
  m.waiting->Add({}).Set(static_cast<double>(s.waiting));
  m.swapped->Add({}).Set(static_cast<double>(s.swapped));
  m.kda_slots->Add({{"state", "used"}}).Set(static_cast<double>(s.slots_used));
  m.kda_slots->Add({{"state", "total"}}).Set(static_cast<double>(s.slots_total));
  m.kv_pages->Add({{"state", "used"}}).Set(static_cast<double>(s.pages_used));
  m.kv_pages->Add({{"state", "total"}}).Set(static_cast<double>(s.pages_total));
  m.kv_pages->Add({{"state", "cached"}}).Set(static_cast<double>(s.pages_cached));
  m.attn_res->Add({{"state", "used"}}).Set(static_cast<double>(s.attn_res_bytes_used));
  m.attn_res->Add({{"state", "total"}}).Set(static_cast<double>(s.attn_res_bytes_total));
  std::lock_guard<std::mutex> lock(m.mu);
  auto inc = [](p::Counter& c, int64_t now, int64_t before) {
    if (now > before) c.Increment(static_cast<double>(now - before));
  };
  inc(m.prefix_queries->Add({}), s.prefix_queries, m.last.prefix_queries);
  inc(m.prefix_hits->Add({}), s.prefix_hits, m.last.prefix_hits);
  inc(m.prefix_saved->Add({}), s.prefix_saved_tokens, m.last.prefix_saved_tokens);
  inc(m.preemptions->Add({{"kind", "swap"}}), s.preempt_swap, m.last.preempt_swap);
  inc(m.preemptions->Add({{"kind", "recompute"}}), s.preempt_recompute, m.last.preempt_recompute);
  m.last = s;
}

void Metrics::OnWarmUpStep(const sched::SchedulerStats& stats) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->last = stats;  // the baseline: SetPools counts only what comes after it
  }
  SetPools(stats);
}

void Metrics::OnStep(const sched::StepStats& step, const sched::SchedulerStats& stats) {
  Impl& m = *impl_;
  SetPools(stats);
  if (step.batch_size == 0) return;  // an idle pass: pools only
  for (const MoeLayerStats& s : step.moe) {
    const std::string layer = std::to_string(s.layer);
    m.expert_imbalance->Add({{"layer", layer}}).Set(s.expert_imbalance);
    m.rank_imbalance->Add({{"layer", layer}, {"placement", "owner"}}).Set(s.rank_imbalance);
    m.rank_imbalance->Add({{"layer", layer}, {"placement", "balanced"}})
        .Set(s.balanced_imbalance);
    if (s.replicated > 0) m.replicated->Add({}).Increment(static_cast<double>(s.replicated));
  }
  m.step->Add({}, kLatency).Observe(step.seconds);
  m.batch->Add({}, kBatch).Observe(static_cast<double>(step.batch_size));
  m.step_tokens->Add({{"phase", "prefill"}}).Increment(static_cast<double>(step.prefill_tokens));
  m.step_tokens->Add({{"phase", "decode"}}).Increment(static_cast<double>(step.decode_tokens));
  const double total = step.seconds + step.overhead;
  m.overhead->Add({}).Set(total > 0 ? step.overhead / total : 0.0);
}

void Metrics::OnFirstToken(double ttft, double queue) {
  impl_->ttft->Add({}, kLatency).Observe(ttft);
  if (queue >= 0) impl_->queue->Add({}, kLatency).Observe(queue);
}

void Metrics::OnToken(double itl) { impl_->itl->Add({}, kLatency).Observe(itl); }

void Metrics::OnFinished(sched::FinishReason reason, int64_t prompt, int64_t completion,
                         double e2e) {
  Impl& m = *impl_;
  m.requests->Add({{"finish_reason", sched::FinishReasonName(reason)}}).Increment();
  m.prompt_tokens->Add({}).Increment(static_cast<double>(prompt));
  m.generation_tokens->Add({}).Increment(static_cast<double>(completion));
  m.e2e->Add({}, kLatency).Observe(e2e);
}

void Metrics::OnCancelled(const std::string& reason) {
  impl_->cancellations->Add({{"reason", reason}}).Increment();
}

void Metrics::OnRejected(const std::string& code) {
  impl_->rejected->Add({{"code", code}}).Increment();
}

void Metrics::OnAuthFailure() { impl_->auth_failures->Add({}).Increment(); }

std::string Metrics::Scrape() const {
  p::TextSerializer s;
  return s.Serialize(impl_->registry->Collect());
}

}  // namespace kimi::server
