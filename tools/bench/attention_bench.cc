// kda.prefill.per_token_16k_over_1k: the KDA chunked kernel's time per token for a whole 16k-token
// prefill over that of a 1k-token prefill (linear cost: ~1). Baseline: the same ratio for the MLA
// attention kernel of the same model (kimi-linear-small dims), whose per-token cost grows with the
// context; measured on a 128-query chunk at the end of a 1k and of a 16k context (for cost linear
// in the position this equals the whole-prefill ratio, which would take minutes to measure).
// ratio = KDA ratio / MLA ratio.
//
// mla.decode.64k: one decode token's MLA latent attention at 64k keys (kimi-linear-small dims: an
// 84 MB latent cache, beyond any L3 here), on all threads: value = cache bytes / median time;
// baseline = streaming read of the same cache rows in the same rounds; ratio = value / baseline.
// Decode at long context reads the cache once per layer and token; with 8 heads the kernel also
// does 3.6 multiply-adds per cache byte, so the detail gives its GFLOP/s.
#include <cmath>
#include <random>
#include <span>

#include "absl/strings/str_format.h"
#include "engine/synthetic_model.h"
#include "kernels/cpu/cache_line.h"
#include "kernels/cpu/kda.h"
#include "kernels/cpu/mla.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/paged.h"
#include "tools/bench/bench.h"

namespace kimi::bench {
namespace {

struct KdaInputs {
  int64_t T, H, K;
  std::vector<float> q, k, v, g, beta, o, state;
  KdaInputs(int64_t t, int64_t h, int64_t dim, uint32_t seed)
      : T(t), H(h), K(dim), q(t * h * dim), k(t * h * dim), v(t * h * dim), g(t * h * dim),
        beta(t * h), o(t * h * dim), state(h * dim * dim) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (auto* x : {&q, &k}) {
      for (int64_t r = 0; r < t * h; ++r) {  // L2-normalised rows, as the layer feeds them
        float ss = 0.0f;
        for (int64_t i = 0; i < dim; ++i) ss += ((*x)[r * dim + i] = n(rng)) * (*x)[r * dim + i];
        for (int64_t i = 0; i < dim; ++i) (*x)[r * dim + i] /= std::sqrt(ss);
      }
    }
    for (float& x : v) x = n(rng);
    for (float& x : g) x = -0.2f * u(rng) * u(rng);  // log decay, mostly slow
    for (float& x : beta) x = 0.2f + 0.6f * u(rng);
  }
  double Run() {
    std::fill(state.begin(), state.end(), 0.0f);
    const double t0 = Now();
    cpu::KdaChunk(o.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), state.data(),
                  cpu::KdaDims{T, H, K, K}, 1.0f / std::sqrt(static_cast<float>(K)));
    return Now() - t0;
  }
};

struct MlaInputs {
  cpu::MlaDims d;
  int64_t context, chunk;
  std::vector<float> pool_storage, q, out;
  std::span<float> pool;  // from a cache line, as the engine's MlaKvCache is (it is mapped)
  std::vector<int32_t> pages;
  std::vector<uint16_t> kv_b;
  Weight w;
  MlaInputs(const ModelConfig& c, int64_t ctx_len, int64_t chunk_len, uint32_t seed)
      : d{c.mla.num_heads, c.mla.qk_nope_head_dim, c.mla.qk_rope_head_dim, c.mla.v_head_dim,
          c.mla.kv_lora_rank},
        context(ctx_len),
        chunk(chunk_len) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const int64_t width = d.rank + d.rope;
    pool = {cpu::CacheLineAligned(pool_storage, ctx_len * width),
            static_cast<size_t>(ctx_len * width)};
    for (float& x : pool) x = n(rng);
    pages.resize(ctx_len / 16);
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
    q.resize(chunk_len * d.heads * (d.nope + d.rope));
    for (float& x : q) x = n(rng);
    out.resize(chunk_len * d.heads * d.v);
    kv_b.resize(d.heads * (d.nope + d.v) * d.rank);
    for (auto& x : kv_b) x = F32ToBf16(n(rng) / std::sqrt(static_cast<float>(d.rank)));
    w.data = kv_b.data();
    w.format = WeightFormat::kBF16;
    w.rows = d.heads * (d.nope + d.v);
    w.cols = d.rank;
  }
  double Run() {
    const PagedRows rows{pool.data(), pages.data(), 16, d.rank + d.rope};
    const double t0 = Now();
    cpu::MlaAttention(out.data(), q.data(), chunk, context - chunk, rows, w, d,
                      1.0f / std::sqrt(static_cast<float>(d.nope + d.rope)));
    return Now() - t0;
  }
};

// Median over >= 3 runs and >= 0.2 s.
template <class F>
double TimeMedian(F fn) {
  std::vector<double> t;
  const double start = Now();
  while (t.size() < 3 || (Now() - start < 0.2 && t.size() < 20)) t.push_back(fn());
  return Median(t);
}

}  // namespace

void RunAttentionScaling(const Context& ctx) {
  const std::string name = "kda.prefill.per_token_16k_over_1k";
  if (!ctx.Wants(name)) return;
  auto json = PresetConfigJson("kimi-linear-small", 100256);
  auto c = ParseModelConfig(*json);
  const int64_t H = c->kda.num_heads, K = c->kda.head_dim;
  KdaInputs kda1(1024, H, K, 1), kda16(16384, H, K, 2);
  constexpr int64_t kChunk = 128;
  MlaInputs mla1(*c, 1024, kChunk, 3), mla16(*c, 16384, kChunk, 4);
  std::vector<double> kr, mr, k1, k16, m1, m16, other;
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    CpuMeter meter;
    k1.push_back(TimeMedian([&] { return kda1.Run(); }) / 1024);
    k16.push_back(kda16.Run() / 16384);
    m1.push_back(TimeMedian([&] { return mla1.Run(); }) / kChunk);
    m16.push_back(TimeMedian([&] { return mla16.Run(); }) / kChunk);
    kr.push_back(k16.back() / k1.back());
    mr.push_back(m16.back() / m1.back());
    other.push_back(meter.OtherFraction());
  }
  Figure f;
  f.name = name;
  f.value = Median(kr);
  f.unit = "x";
  f.baseline = Median(mr);
  f.ratio = f.value / *f.baseline;
  f.note = "KDA prefill time/token at 16k over 1k; baseline: same for MLA attention (grows)";
  f.detail["kda_us_per_token_1k"] = 1e6 * Median(k1);
  f.detail["kda_us_per_token_16k"] = 1e6 * Median(k16);
  f.detail["mla_us_per_token_at_1k"] = 1e6 * Median(m1);
  f.detail["mla_us_per_token_at_16k"] = 1e6 * Median(m16);
  f.detail["heads"] = H;
  f.detail["head_dim"] = K;
  f.detail["other_cpu_median"] = Median(other);
  ctx.Emit(f);
}

void RunMlaDecode(const Context& ctx) {
  const std::string name = "mla.decode.64k";
  if (!ctx.Wants(name) || ctx.profile_steps > 0) return;
  auto json = PresetConfigJson("kimi-linear-small", 100256);
  auto c = ParseModelConfig(*json);
  constexpr int64_t kContext = 65536;
  MlaInputs in(*c, kContext, 1, 5);
  const int64_t width = in.d.rank + in.d.rope;
  // Absorbed queries of one token.
  std::vector<float> qa(in.d.heads * width), out(in.d.heads * in.d.rank);
  std::mt19937 rng(6);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (float& x : qa) x = n(rng);
  const PagedRows rows{in.pool.data(), in.pages.data(), 16, width};
  const double bytes = static_cast<double>(in.pool.size() * sizeof(float));
  const float scale = 1.0f / std::sqrt(static_cast<float>(in.d.nope + in.d.rope));
  const std::vector<std::span<const uint8_t>> regions = {
      {reinterpret_cast<const uint8_t*>(in.pool.data()), static_cast<size_t>(bytes)}};
  const int threads = cpu::ThreadPool::Global().num_threads();
  std::vector<double> bw, gbps, ratios, us;
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    bw.push_back(StreamReadGBps(regions, threads));
    const double t = TimeMedian([&] {
      const double t0 = Now();
      cpu::MlaLatentAttention(out.data(), qa.data(), 1, kContext - 1, rows, in.d.heads, in.d.rank,
                              in.d.rope, scale);
      return Now() - t0;
    });
    us.push_back(1e6 * t);
    gbps.push_back(bytes / t / 1e9);
    ratios.push_back(gbps.back() / bw.back());
  }
  Figure f = MedianFigure(name, "GB/s", gbps, bw, ratios);
  f.note = absl::StrFormat(
      "latent-cache bytes / time, one token, %lld keys, %lld heads, rank %lld + rope %lld, %d "
      "thread(s); baseline: streaming read",
      static_cast<long long>(kContext), static_cast<long long>(in.d.heads),
      static_cast<long long>(in.d.rank), static_cast<long long>(in.d.rope), threads);
  f.detail["us_per_token_layer"] = Median(us);
  // Scores over rank + rope and values over rank, per head and key.
  const double flops = 2.0 * in.d.heads * kContext * (width + in.d.rank);
  f.detail["GFLOPs"] = flops / Median(us) / 1e3;
  f.detail["threads"] = threads;
  f.detail["per_round_ratio"] = ratios;
  ctx.Emit(f);
}

}  // namespace kimi::bench
