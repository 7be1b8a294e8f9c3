// kda.prefill.per_token_16k_over_1k: the KDA chunked kernel's time per token for a whole 16k-token
// prefill over that of a 1k-token prefill (linear cost: ~1). Baseline: the same ratio for the MLA
// attention kernel of the same model (kimi-linear-small dims), whose per-token cost grows with the
// context; measured on a 128-query chunk at the end of a 1k and of a 16k context (for cost linear
// in the position this equals the whole-prefill ratio, which would take minutes to measure).
// ratio = KDA ratio / MLA ratio.
#include <cmath>
#include <random>

#include "absl/strings/str_format.h"
#include "engine/synthetic_model.h"
#include "kernels/cpu/kda.h"
#include "kernels/cpu/mla.h"
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
  std::vector<float> pool, q, out;
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
    pool.resize(ctx_len * width);
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

}  // namespace kimi::bench
