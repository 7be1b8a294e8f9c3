// state.128k.hybrid_over_mla: per-request state at a 128k context, KDA:MLA 3:1 (kimi-linear-small's
// layer schedule) over the same model with every layer MLA. Computed from the pools' own sizing
// (KdaStatePool::SlotBytes, MlaKvCache::BytesPerToken): exact, nothing timed. Baseline: 0.25, the
// seeds' public figure (75% less); ratio = value / baseline.
//
// scheduler.overhead.b64: the EngineLoop at 64 running decodes; value = median over decode steps
// of overhead / (engine step + overhead), overhead being scheduling, sampling and streaming
// around the engine step (StepStats from LoopConfig::on_step).
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/plan.h"
#include "engine/synthetic_model.h"
#include "scheduler/engine_loop.h"
#include "tools/bench/bench.h"

namespace kimi::bench {
namespace {

int64_t StateBytes(const ModelConfig& c, int64_t context) {
  const ModelPlan p = PlanModel(c);
  return p.kda_state_bytes + context * p.kv_bytes_per_token;
}

class Discard : public sched::RequestSink {
 public:
  void OnEvent(sched::StreamEvent) override {}
};

}  // namespace

void RunState(const Context& ctx) {
  const std::string name = "state.128k.hybrid_over_mla";
  if (!ctx.Wants(name)) return;
  Figure f;
  f.name = name;
  f.unit = "fraction";
  f.note = "state+KV bytes per request at 128k, KDA:MLA 3:1 over all-MLA; baseline: public 0.25";
  for (const char* preset : {"kimi-linear-small", "k3-mini"}) {
    auto c = ParseModelConfig(*PresetConfigJson(preset, 100256));
    ModelConfig all_mla = *c;
    for (LayerKind& k : all_mla.layer_kinds) k = LayerKind::kMla;
    constexpr int64_t kContext = 128 * 1024;
    const double hybrid = static_cast<double>(StateBytes(*c, kContext));
    const double mla = static_cast<double>(StateBytes(all_mla, kContext));
    nlohmann::ordered_json d;
    d["kda_layers"] = c->NumLayersOf(LayerKind::kKda);
    d["mla_layers"] = c->NumLayersOf(LayerKind::kMla);
    d["hybrid_bytes_128k"] = hybrid;
    d["all_mla_bytes_128k"] = mla;
    d["kda_state_bytes_1k"] = PlanModel(*c).kda_state_bytes;    // the recurrent state does not
    d["kda_state_bytes_128k"] = PlanModel(*c).kda_state_bytes;  // grow with the context
    d["hybrid_over_mla"] = hybrid / mla;
    f.detail[preset] = d;
    if (std::string(preset) == "kimi-linear-small") f.value = hybrid / mla;
  }
  f.baseline = 0.25;
  f.ratio = f.value / 0.25;
  ctx.Emit(f);
}

void RunSchedulerOverhead(const Context& ctx, const std::string& preset) {
  const std::string name = "scheduler.overhead.b64";
  if (!ctx.Wants(name)) return;
  std::unique_ptr<Model> m = LoadPreset(ctx, preset);
  if (!m) return;
  constexpr int kRequests = 64, kPrompt = 8, kMaxTokens = 8;
  std::vector<double> fraction, step_s, overhead_s;
  for (int r = 0; r < std::max(1, ctx.repeats / 2); ++r) {
    WaitForIdle(ctx.idle_wait_s);
    sched::LoopConfig config;
    config.scheduler.max_running = kRequests;
    config.scheduler.num_pages = kRequests * 4;
    config.scheduler.page_size = 16;
    config.scheduler.token_budget = kRequests * kPrompt;
    config.on_step = [&](const sched::StepStats& s, const sched::SchedulerStats&) {
      if (s.batch_size == kRequests && s.decode_tokens == kRequests) {
        fraction.push_back(s.overhead / (s.seconds + s.overhead));
        step_s.push_back(s.seconds);
        overhead_s.push_back(s.overhead);
      }
    };
    sched::EngineLoop loop(*m, config);
    auto sink = std::make_shared<Discard>();
    for (int i = 0; i < kRequests; ++i) {
      sched::RequestSpec spec;
      spec.id = absl::StrCat("r", r, "-", i);
      for (int t = 0; t < kPrompt; ++t) spec.prompt.push_back(static_cast<int32_t>((7919 * (i + 1) + 31 * t) % m->config().vocab));
      spec.max_tokens = kMaxTokens;
      spec.sampling.temperature = 0.8f;
      spec.sampling.top_p = 0.95f;
      spec.sampling.top_k = 40;
      spec.sampling.seed = static_cast<uint64_t>(i);
      spec.sampling.want_logprobs = true;
      if (absl::Status s = loop.Submit(spec, {}, sink); !s.ok()) {
        ctx.Log(absl::StrCat("submit failed: ", s.message()));
        return;
      }
    }
    for (int i = 0; i < 10000 && loop.RunOnce(); ++i) {
    }
  }
  Figure f;
  f.name = name;
  f.value = Median(fraction);
  f.unit = "fraction";
  f.note = absl::StrCat("share of a 64-decode step spent outside the engine (", preset, ")");
  f.detail["model"] = preset;
  f.detail["steps"] = fraction.size();
  f.detail["engine_ms"] = 1e3 * Median(step_s);
  f.detail["overhead_ms"] = 1e3 * Median(overhead_s);
  ctx.Emit(f);
}

}  // namespace kimi::bench
