// decode.b1.<model> and decode.b8|b32|b64.<model>: engine steps of one token per sequence;
// prefill.<N>.<model>: one N-token prompt (--prefill_tokens, 512 by default).
//
// b1: value = weight bytes one token reads (Model::ActiveWeightBytes: MXFP4 experts at their packed
// size) / median time per token, baseline = streaming-read bandwidth over the weights' own memory
// (same pages, same huge-page treatment) measured in the same rounds; ratio = value / baseline.
// bN and prefill.512: value = median step time; baseline = roofline step time
//     max(weight bytes touched in the step / read bandwidth, matmul flops / GEMM peak)
// with the bandwidth and the peak (the best library GEMM at the step's activation precision,
// GemmPeakMeter) measured in each round beside the steps; ratio = median of the rounds' roofline /
// measured. bN's detail adds the KDA state a step reads and writes (every sequence's, outside that
// roofline) and the ratio with it counted on the memory side, round by round.
#include <algorithm>
#include <cassert>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tools/bench/bench.h"

namespace kimi::bench {
namespace {

// N sequences with their own state slots and pages, fed one token per step.
class DecodeBatch {
 public:
  DecodeBatch(const Model& m, int n, int64_t max_pos, EngineOptions options = {})
      : model_(m),
        kda_(m.config(), n),
        kv_(m.config(), n * ((max_pos + kPage - 1) / kPage), kPage),
        engine_(m, {}, options),
        n_(n) {
    const int64_t per = (max_pos + kPage - 1) / kPage;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> p(per);
      for (int64_t j = 0; j < per; ++j) p[j] = static_cast<int32_t>(i * per + j);
      pages_.push_back(std::move(p));
      kda_.Clear(i);
    }
    pos_.assign(n, 0);
  }

  // Runs `len` prompt tokens for every sequence in one step.
  void Prefill(int64_t len) {
    std::vector<std::vector<int32_t>> tokens(n_);
    for (int i = 0; i < n_; ++i) {
      for (int64_t t = 0; t < len; ++t) tokens[i].push_back(Token(i, t));
    }
    Run(tokens);
  }

  // One decode token per sequence; returns the engine step's seconds.
  double Step() {
    std::vector<std::vector<int32_t>> tokens(n_);
    for (int i = 0; i < n_; ++i) tokens[i].push_back(Token(i, pos_[i]));
    const double t0 = Now();
    Run(tokens);
    return Now() - t0;
  }

 private:
  static constexpr int64_t kPage = 16;
  int32_t Token(int i, int64_t t) const {
    return static_cast<int32_t>((1000003ull * (i + 1) + 7919ull * t) % model_.config().vocab);
  }
  void Run(const std::vector<std::vector<int32_t>>& tokens) {
    std::vector<SequenceStep> batch(n_);
    for (int i = 0; i < n_; ++i) {
      batch[i].kda_slot = i;
      batch[i].pages = pages_[i];
      batch[i].pos0 = pos_[i];
      batch[i].tokens = tokens[i];
      batch[i].logits = LogitsWanted::kLast;
    }
    EngineState state{&kda_, &kv_};
    if (absl::Status s = engine_.Step(batch, state, &out_); !s.ok()) {
      std::fprintf(stderr, "[bench] engine step failed: %s\n", std::string(s.message()).c_str());
      std::abort();
    }
    for (int i = 0; i < n_; ++i) pos_[i] += static_cast<int64_t>(tokens[i].size());
  }

  const Model& model_;
  KdaStatePool kda_;
  MlaKvCache kv_;
  Engine engine_;
  StepOutput out_;  // kept between steps, as the engine loop keeps its own
  int n_;
  std::vector<std::vector<int32_t>> pages_;
  std::vector<int64_t> pos_;
};

// What one step reads and computes, from the MatMul accounting of a real step.
struct StepCost {
  int64_t weight_bytes = 0;  // distinct weights touched (routed experts as actually hit)
  int64_t flops = 0;         // matmul flops
  int64_t experts_hit = 0, experts_total = 0;
};

// The cost of one call of `run` (a decode step or a prefill).
StepCost MeasureStepCost(const Model& m, const std::function<void()>& run) {
  const ModelWeights& w = m.weights();
  const ModelConfig& c = m.config();
  // Routed expert matrices by address, and what ActiveWeightBytes assumed for them (top_k each).
  std::map<const void*, int64_t> expert_of;  // gate data -> expert bytes
  int64_t assumed = 0;
  for (const LayerWeights& L : w.layers) {
    if (!L.is_moe) continue;
    for (const MlpWeights& e : L.moe.experts) {
      const int64_t b = e.gate.Bytes() + e.up.Bytes() + e.down.Bytes();
      expert_of[e.gate.data] = b;
    }
    if (!L.moe.experts.empty()) {
      const MlpWeights& e = L.moe.experts[0];
      assumed += c.moe.top_k * (e.gate.Bytes() + e.up.Bytes() + e.down.Bytes());
    }
  }
  cpu::MatMulStats stats;
  cpu::SetMatMulStats(&stats);
  run();
  cpu::SetMatMulStats(nullptr);
  std::set<const void*> hit;
  for (const auto& r : stats.reads) {
    if (expert_of.count(r.data)) hit.insert(r.data);
  }
  StepCost cost;
  cost.weight_bytes = m.ActiveWeightBytes() - assumed;
  for (const void* p : hit) cost.weight_bytes += expert_of[p];
  cost.flops = stats.flops;
  cost.experts_hit = static_cast<int64_t>(hit.size());
  cost.experts_total = static_cast<int64_t>(expert_of.size());
  return cost;
}

// --profile_steps N: `run` alone N times, for perf (the median logged), then with --matmul_profile
// N times more with every MatMul timed. `unit` names one run: "token", "step", "prefill".
void ProfileRun(const Context& ctx, const std::string& name, const char* unit,
                const std::function<double()>& run) {
  std::vector<double> t;
  for (int i = 0; i < ctx.profile_steps; ++i) t.push_back(run());
  ctx.Log(absl::StrFormat("%s: median %s %.3f ms over %d %ss (profile run)", name, unit,
                          1e3 * Median(t), ctx.profile_steps, unit));
  if (ctx.matmul_profile) ProfileMatMuls(ctx, name, ctx.profile_steps, run);
}

void DecodeB1(const Context& ctx, const std::string& preset, const Model& m) {
  const std::string name2 = "decode.b1." + preset, name1 = name2 + ".t1";
  const bool want2 = ctx.Wants(name2), want1 = ctx.Wants(name1);
  if (!want2 && !want1) return;
  constexpr int kTokens = 12;
  DecodeBatch batch(m, 1, 16 + 2 * (ctx.repeats + 1) * kTokens + 4 * ctx.profile_steps);
  batch.Prefill(8);
  const auto regions = m.WeightRegions();
  const double bytes = static_cast<double>(m.ActiveWeightBytes());
  auto& pool = cpu::ThreadPool::Global();
  const int all = pool.num_threads();
  std::vector<double> bw[2], tok[2], other;
  batch.Step();  // warm-up: first touch of every active weight
  if (ctx.profile_steps > 0) {  // tokens alone, on the threads of each figure asked for
    for (int v = 0; v < 2; ++v) {
      if ((v == 0 && !want2) || (v == 1 && !want1)) continue;
      pool.SetActiveThreads(v == 0 ? all : 1);
      ProfileRun(ctx, v == 0 ? name2 : name1, "token", [&] { return batch.Step(); });
      pool.SetActiveThreads(0);
    }
    return;
  }
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    CpuMeter meter;
    for (int v = 0; v < 2; ++v) {
      if ((v == 0 && !want2) || (v == 1 && !want1)) continue;
      const int threads = v == 0 ? all : 1;
      bw[v].push_back(StreamReadGBps(regions, threads));
      pool.SetActiveThreads(threads);
      std::vector<double> t;
      for (int i = 0; i < kTokens; ++i) t.push_back(batch.Step());
      pool.SetActiveThreads(0);
      tok[v].push_back(Median(t));
    }
    other.push_back(meter.OtherFraction());
  }
  const StepCost cost = MeasureStepCost(m, [&] { batch.Step(); });
  for (int v = 0; v < 2; ++v) {
    if (tok[v].empty()) continue;
    std::vector<double> ratios;
    for (size_t r = 0; r < tok[v].size(); ++r) ratios.push_back(bytes / tok[v][r] / 1e9 / bw[v][r]);
    Figure f;
    f.name = v == 0 ? name2 : name1;
    f.value = bytes / Median(tok[v]) / 1e9;
    f.unit = "GB/s";
    f.baseline = Median(bw[v]);
    f.ratio = Median(ratios);
    f.note = absl::StrFormat("weights read per token / time, %d thread(s); baseline: streaming read",
                             v == 0 ? all : 1);
    f.detail["threads"] = v == 0 ? all : 1;
    f.detail["tokens_per_s"] = 1.0 / Median(tok[v]);
    f.detail["ms_per_token"] = 1e3 * Median(tok[v]);
    f.detail["weight_bytes_per_token"] = bytes;
    f.detail["matmul_distinct_bytes_check"] = cost.weight_bytes;
    f.detail["per_round_ratio"] = ratios;
    f.detail["per_round_bw_GBps"] = bw[v];
    f.detail["other_cpu_median"] = Median(other);
    f.detail["weight_memory"] = ctx.weight_memory.empty() ? WeightMemoryName(DefaultWeightMemory())
                                                          : ctx.weight_memory;
    f.detail["isa"] = cpu::IsaName(cpu::MatMulIsa());
    f.detail["kda_state_dtype"] = KdaStateDtypeName(m.config().kda.state_dtype);
    ctx.Emit(f);
  }
}

// A figure of `run`'s time (seconds, the median of `samples` calls a round) against its roofline,
// max(weight bytes touched / read bandwidth, matmul flops / GEMM peak at the activation precision),
// with the bandwidth and the peak measured in every round beside the calls: value = median time
// (ms), baseline = median roofline (ms), ratio = median of the rounds' roofline / time. With
// `state_bytes` (the KDA state a step reads and writes, outside that roofline) the detail adds the
// same per round with those bytes on the memory side, at the rate of reading memory and writing it
// back measured in that round: a state is read and written back in one pass, and reads with
// write-backs move more bytes than reads alone (on the AMX host two threads moved 52-56 GB/s so,
// against a 32-36 GB/s read).
Figure RooflineFigure(const Context& ctx, const Model& m, const StepCost& cost,
                      GemmPeakMeter* meter, bool bf16, int samples,
                      const std::function<double()>& run, double state_bytes = 0) {
  const auto regions = m.WeightRegions();
  const double bytes = static_cast<double>(cost.weight_bytes);
  const double flops = static_cast<double>(cost.flops);
  std::vector<double> bw, state_bw, peak, step, other, roofs, ratios, roofs_with_state,
      ratios_with_state;
  int compute_bound = 0;
  const int threads = cpu::ThreadPool::Global().num_threads();
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    CpuMeter cpu_meter;
    bw.push_back(StreamReadGBps(regions, threads));
    if (state_bytes > 0) {
      state_bw.push_back(StreamReadWriteGBps(static_cast<int64_t>(state_bytes / 2), threads));
    }
    peak.push_back(meter->Measure(bf16));
    std::vector<double> t;
    for (int i = 0; i < samples; ++i) t.push_back(run());
    step.push_back(Median(t));
    other.push_back(cpu_meter.OtherFraction());
    const double t_mem = bytes / (bw.back() * 1e9);
    const double t_compute = peak.back() > 0 ? flops / (peak.back() * 1e9) : 0.0;
    compute_bound += t_compute > t_mem ? 1 : 0;
    roofs.push_back(std::max(t_mem, t_compute));
    ratios.push_back(roofs.back() / step.back());
    const double t_state = state_bytes > 0 ? state_bytes / (state_bw.back() * 1e9) : 0.0;
    roofs_with_state.push_back(std::max(t_mem + t_state, t_compute));
    ratios_with_state.push_back(roofs_with_state.back() / step.back());
  }
  const double step_med = Median(step);
  Figure f;
  f.value = 1e3 * step_med;
  f.unit = "ms";
  f.baseline = 1e3 * Median(roofs);
  f.ratio = Median(ratios);
  f.note = absl::StrFormat(
      "step time; baseline: roofline max(bytes/BW, flops/%s GEMM peak), both per round, "
      "%s-bound in %d of %d rounds",
      bf16 ? "bf16" : "fp32", compute_bound * 2 > ctx.repeats ? "compute" : "memory",
      compute_bound * 2 > ctx.repeats ? compute_bound : ctx.repeats - compute_bound, ctx.repeats);
  f.detail["activations"] = bf16 ? "bf16" : "fp32";
  f.detail["weight_bytes_touched"] = cost.weight_bytes;
  f.detail["matmul_flops"] = cost.flops;
  f.detail["experts_hit"] = cost.experts_hit;
  f.detail["experts_total"] = cost.experts_total;
  f.detail["bw_GBps"] = Median(bw);
  f.detail["gemm_peak_GFLOPs"] = Median(peak);
  f.detail["roofline_ms_memory"] = 1e3 * bytes / (Median(bw) * 1e9);
  f.detail["roofline_ms_compute"] = Median(peak) > 0 ? 1e3 * flops / (Median(peak) * 1e9) : 0.0;
  f.detail["achieved_GFLOPs"] = flops / step_med / 1e9;
  f.detail["per_round_ratio"] = ratios;
  f.detail["per_round_bw_GBps"] = bw;
  f.detail["per_round_gemm_peak_GFLOPs"] = peak;
  std::vector<double> step_ms;
  for (double t : step) step_ms.push_back(1e3 * t);
  f.detail["per_round_step_ms"] = step_ms;
  f.detail["other_cpu_median"] = Median(other);
  f.detail["kda_state_dtype"] = KdaStateDtypeName(m.config().kda.state_dtype);
  if (state_bytes > 0) {
    f.detail["kda_state_bytes_moved"] = state_bytes;
    f.detail["state_read_write_GBps"] = Median(state_bw);
    f.detail["roofline_ms_with_state"] = 1e3 * Median(roofs_with_state);
    f.detail["ratio_with_state"] = Median(ratios_with_state);
  }
  return f;
}

void DecodeBatched(const Context& ctx, const std::string& preset, const Model& m, int n,
                   GemmPeakMeter* meter, bool bf16) {
  const std::string name = absl::StrCat("decode.b", n, ".", preset, bf16 ? ".bf16" : "");
  if (!ctx.Wants(name)) return;
  if (bf16 && !cpu::HasBf16DotProduct()) return;
  const int steps = std::max(ctx.profile_steps, n >= 32 ? 3 : 5);
  EngineOptions options;
  if (bf16) options.activation = cpu::ActivationDtype::kBf16;
  DecodeBatch batch(m, n, 16 + (ctx.repeats + 2) * steps + 8, options);
  batch.Prefill(8);
  batch.Step();  // warm-up
  if (ctx.profile_steps > 0) {
    ProfileRun(ctx, name, "step", [&] { return batch.Step(); });
    return;
  }
  assert(meter != nullptr);  // built whenever a batched figure runs with baselines
  const StepCost cost = MeasureStepCost(m, [&] { batch.Step(); });
  // Outside the roofline (weights only, as the issue defines it): the KDA state, every sequence's
  // recurrent state and conv history, read and written once a step. At batch 32 that is 23% of
  // kimi-linear-small's weight bytes, and more than the cache keeps between steps on the AMX host
  // (benchmarks/README.md, its seventh session): a real part of the step's memory time.
  const double state_bytes = 2.0 * n * static_cast<double>(KdaStatePool::SlotBytes(m.config()));
  Figure f = RooflineFigure(
      ctx, m, cost, meter, bf16, steps, [&] { return batch.Step(); }, state_bytes);
  f.name = name;
  f.detail["batch"] = n;
  f.detail["tokens_per_s"] = n / (f.value / 1e3);
  ctx.Emit(f);
}

// prefill.<N>.<model> (N = --prefill_tokens, 512 by default: the server's default token budget,
// so a longer prompt's every chunk): one sequence's N-token prompt as one step from fresh state,
// against the roofline of its own matmul flops and weight bytes, as the batched decode figures;
// fp32 activations. Each run builds and clears its state pools before the clock starts; the KV
// pages' first touch is inside it, as a new slot's is in a server. The detail counts the minor
// page faults of one prefill (the KV pages', and any step buffer the heap does not keep).
void Prefill(const Context& ctx, const std::string& preset, const Model& m, GemmPeakMeter* meter) {
  const std::string name = ctx.PrefillName(preset);
  if (!ctx.Wants(name)) return;
  const int64_t len = ctx.prefill_tokens;
  const auto fresh_prefill = [&] {
    DecodeBatch batch(m, 1, len + 16);
    const double t0 = Now();
    batch.Prefill(len);
    return Now() - t0;
  };
  fresh_prefill();  // warm-up
  if (ctx.profile_steps > 0) {
    ProfileRun(ctx, name, "prefill", fresh_prefill);
    return;
  }
  assert(meter != nullptr);
  StepCost cost;
  int64_t faults = 0;
  {
    DecodeBatch batch(m, 1, len + 16);
    const int64_t before = MinorPageFaults();
    cost = MeasureStepCost(m, [&] { batch.Prefill(len); });
    faults = MinorPageFaults() - before;
  }
  Figure f = RooflineFigure(ctx, m, cost, meter, /*bf16=*/false, 2, fresh_prefill);
  f.name = name;
  f.detail["prompt_tokens"] = len;
  f.detail["tokens_per_s"] = static_cast<double>(len) / (f.value / 1e3);
  f.detail["minor_page_faults"] = faults;
  ctx.Emit(f);
}

}  // namespace

void RunDecode(const Context& ctx, const std::string& preset, GemmPeakMeter* meter) {
  std::vector<std::string> names = {"decode.b1." + preset, "decode.b1." + preset + ".t1"};
  for (int n : {8, 32, 64}) {
    names.push_back(absl::StrCat("decode.b", n, ".", preset));
    names.push_back(absl::StrCat("decode.b", n, ".", preset, ".bf16"));
  }
  names.push_back(ctx.PrefillName(preset));
  if (!ctx.WantsAny(names)) return;
  std::unique_ptr<Model> m = LoadPreset(ctx, preset);
  if (!m) return;
  DecodeB1(ctx, preset, *m);
  for (bool bf16 : {false, true}) {
    for (int n : {8, 32, 64}) DecodeBatched(ctx, preset, *m, n, meter, bf16);
  }
  Prefill(ctx, preset, *m, meter);
}

}  // namespace kimi::bench
