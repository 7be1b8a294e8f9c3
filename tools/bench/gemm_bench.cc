// prefill.gemm: our MatMul on a prefill-shaped product (M tokens x a bf16 weight) against the
// best library GEMM measured in the same rounds: oneDNN matmul (bf16 and f32, weights prepacked
// once as inference does) and OpenBLAS sgemm, each when the build found it.
// value = our GFLOP/s; baseline = the best library GFLOP/s; ratio = value / baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "kernels/cpu/cache_line.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "tools/bench/bench.h"

#ifdef KIMI_BENCH_HAVE_DNNL
#include "oneapi/dnnl/dnnl.hpp"
#endif
#ifdef KIMI_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace kimi::bench {
namespace {

constexpr int64_t kM = 512, kN = 4096;  // a prefill chunk through a K -> 4096 MLP (K: --gemm_k)

// Runs fn repeatedly for >= 0.25 s; returns GFLOP/s.
template <class F>
double Rate(F fn, double flops) {
  fn();
  int it = 0;
  const double t0 = Now();
  double dt = 0.0;
  do {
    fn();
    ++it;
    dt = Now() - t0;
  } while (dt < 0.25);
  return flops * it / dt / 1e9;
}

// Other runtimes' threads (OpenMP, OpenBLAS) spin for a while after their last job: let them
// settle before timing our own pool, and the other way round.
void Settle() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

#ifdef KIMI_BENCH_HAVE_DNNL
// oneDNN matmul dst[M,N] = src[M,K] * W[K,N], weights in the primitive's preferred (blocked)
// layout, reordered once.
class DnnlGemm {
 public:
  // nullptr when oneDNN has no implementation for `dt` on this machine (bf16 without AVX-512):
  // oneDNN reports that by throwing, which stops here.
  static std::unique_ptr<DnnlGemm> Make(dnnl::memory::data_type dt, const std::vector<float>& x,
                                        const std::vector<float>& w, int64_t k) {
    try {
      return std::make_unique<DnnlGemm>(dt, x, w, k);
    } catch (const dnnl::error& e) {
      std::fprintf(stderr, "[bench] oneDNN %s matmul unavailable here: %s\n",
                   dt == dnnl::memory::data_type::bf16 ? "bf16" : "f32", e.what());
      return nullptr;
    }
  }
  DnnlGemm(dnnl::memory::data_type dt, const std::vector<float>& x, const std::vector<float>& w,
           int64_t k)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using namespace dnnl;
    using tag = memory::format_tag;
    memory::desc a_md({kM, k}, dt, tag::ab), b_any({k, kN}, dt, tag::any),
        c_md({kM, kN}, memory::data_type::f32, tag::ab);
    matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng_);
    memory a32({{kM, k}, memory::data_type::f32, tag::ab}, eng_);
    memory b32({{k, kN}, memory::data_type::f32, tag::ab}, eng_);
    std::copy(x.begin(), x.end(), static_cast<float*>(a32.get_data_handle()));
    float* pb = static_cast<float*>(b32.get_data_handle());
    for (int64_t n = 0; n < kN; ++n) {  // our W is [N, K]
      for (int64_t c = 0; c < k; ++c) pb[c * kN + n] = w[n * k + c];
    }
    a_ = memory(pd.src_desc(), eng_);
    b_ = memory(pd.weights_desc(), eng_);
    c_ = memory(pd.dst_desc(), eng_);
    reorder(a32, a_).execute(stream_, a32, a_);
    reorder(b32, b_).execute(stream_, b32, b_);
    stream_.wait();
    mm_ = matmul(pd);
  }
  void Run() {
    mm_.execute(stream_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}});
    stream_.wait();
  }

 private:
  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::memory a_, b_, c_;
  dnnl::matmul mm_;
};
#endif

}  // namespace

// The prefill-shaped product and the library GEMMs over it, built once: RunGemm times them
// beside our MatMul, and the batched decode figures take their compute roof from them in each of
// their own rounds.
struct GemmPeakMeter::Impl {
  explicit Impl(int64_t depth)
      : k(depth), flops(2.0 * kM * kN * depth), x(kM * depth), wf(kN * depth), y(kM * kN) {
    // The weight from a cache line, as the engine's are (engine/safetensors.cc).
    uint16_t* wb = cpu::CacheLineAligned(wb_storage, kN * k);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& v : x) v = dist(rng);
    for (float& v : wf) v = dist(rng) * 0.05f;
    for (size_t i = 0; i < wf.size(); ++i) {
      wb[i] = F32ToBf16(wf[i]);
      wf[i] = Bf16ToF32(wb[i]);  // every GEMM sees the same weight values
    }
    w.data = wb;
    w.format = WeightFormat::kBF16;
    w.rows = kN;
    w.cols = k;
    cpu::PackInPlace(&w);  // as the engine holds its weights
#ifdef KIMI_BENCH_HAVE_DNNL
    dnnl_bf16 = DnnlGemm::Make(dnnl::memory::data_type::bf16, x, wf, k);
    dnnl_f32 = DnnlGemm::Make(dnnl::memory::data_type::f32, x, wf, k);
#endif
#ifdef KIMI_BENCH_HAVE_OPENBLAS
    openblas_set_num_threads(cpu::ThreadPool::Global().num_threads());
#endif
  }

  // GFLOP/s of each library now; 0 when the build or the machine lacks it.
  double OneDnnBf16() {
#ifdef KIMI_BENCH_HAVE_DNNL
    if (dnnl_bf16) return Rate([&] { dnnl_bf16->Run(); }, flops);
#endif
    return 0.0;
  }
  double OneDnnF32() {
#ifdef KIMI_BENCH_HAVE_DNNL
    if (dnnl_f32) return Rate([&] { dnnl_f32->Run(); }, flops);
#endif
    return 0.0;
  }
  double Blas() {
#ifdef KIMI_BENCH_HAVE_OPENBLAS
    return Rate(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kM, kN, k, 1.0f, x.data(), k,
                      wf.data(), k, 0.0f, y.data(), kN);
        },
        flops);
#else
    return 0.0;
#endif
  }
  // Our MatMul on the same product, fp32 or bf16 activations.
  double Ours(bool bf16) {
    const cpu::ActivationScope scope(bf16 ? cpu::ActivationDtype::kBf16
                                          : cpu::ActivationDtype::kF32);
    return Rate([&] { cpu::MatMul(y.data(), x.data(), w, kM); }, flops);
  }

  const int64_t k;  // the product's K (--gemm_k)
  const double flops;
  std::vector<float> x, wf;
  std::vector<uint16_t> wb_storage;
  std::vector<float> y;
  Weight w;
#ifdef KIMI_BENCH_HAVE_DNNL
  std::unique_ptr<DnnlGemm> dnnl_bf16, dnnl_f32;
#endif
};

GemmPeakMeter::GemmPeakMeter(int64_t k) : impl_(std::make_unique<Impl>(k)) {}
GemmPeakMeter::~GemmPeakMeter() = default;

double GemmPeakMeter::Measure(bool bf16) {
  double peak = 0.0;
  if (bf16) {
    peak = impl_->OneDnnBf16();
  } else {
    peak = std::max(impl_->OneDnnF32(), impl_->Blas());
  }
  Settle();
  // No library for this precision: our own kernel is the roof.
  if (peak == 0.0 && (!bf16 || cpu::HasBf16DotProduct())) peak = impl_->Ours(bf16);
  return peak;
}

void RunGemm(const Context& ctx, GemmPeakMeter& meter) {
  const bool want_f32 = ctx.Wants("prefill.gemm");
  const bool want_bf16 = ctx.Wants("prefill.gemm.bf16") && cpu::HasBf16DotProduct();
  if (!want_f32 && !want_bf16) return;
  GemmPeakMeter::Impl& g = *meter.impl_;
  const int threads = cpu::ThreadPool::Global().num_threads();
  std::vector<double> ours, ours_bf16, d_bf16, d_f32, blas, ratios, ratios_bf16, other;
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    CpuMeter meter_cpu;
    d_bf16.push_back(g.OneDnnBf16());
    d_f32.push_back(g.OneDnnF32());
    blas.push_back(g.Blas());
    const double best = std::max({d_bf16.back(), d_f32.back(), blas.back()});
    Settle();
    ours.push_back(g.Ours(/*bf16=*/false));
    if (want_bf16) {
      ours_bf16.push_back(g.Ours(/*bf16=*/true));
      if (d_bf16.back() > 0) ratios_bf16.push_back(ours_bf16.back() / d_bf16.back());
    }
    Settle();
    other.push_back(meter_cpu.OtherFraction());
    if (best > 0) ratios.push_back(ours.back() / best);
  }
  const double best_f32 = std::max(Median(d_f32), Median(blas));
  if (want_f32) {
    Figure f;
    f.name = "prefill.gemm";
    f.value = Median(ours);
    f.unit = "GFLOP/s";
    const double best = std::max(Median(d_bf16), best_f32);
    if (best > 0) {
      f.baseline = best;
      f.ratio = Median(ratios);
    }
    f.note = absl::StrFormat(
        "MatMul %ldx%ldx%ld, bf16 weights, fp32 activations, %d threads; baseline: best library "
        "GEMM",
        kM, kN, g.k, threads);
    f.detail["k"] = g.k;
    f.detail["onednn_bf16_GFLOPs"] = Median(d_bf16);
    f.detail["onednn_f32_GFLOPs"] = Median(d_f32);
    f.detail["openblas_sgemm_GFLOPs"] = Median(blas);
    f.detail["ratio_to_best_fp32_activation_gemm"] = best_f32 > 0 ? Median(ours) / best_f32 : 0.0;
    f.detail["per_round_ours"] = ours;
    f.detail["isa"] = cpu::IsaName(cpu::MatMulIsa());
    f.detail["other_cpu_median"] = Median(other);
    ctx.Emit(f);
  }
  if (want_bf16) {
    Figure f;
    f.name = "prefill.gemm.bf16";
    f.value = Median(ours_bf16);
    f.unit = "GFLOP/s";
    if (!ratios_bf16.empty()) {
      f.baseline = Median(d_bf16);
      f.ratio = Median(ratios_bf16);
    }
    f.note = absl::StrFormat(
        "as prefill.gemm with the opt-in bf16 activations (vdpbf16ps); baseline: oneDNN bf16");
    f.detail["per_round_ours"] = ours_bf16;
    f.detail["other_cpu_median"] = Median(other);
    ctx.Emit(f);
  }
}

}  // namespace kimi::bench
