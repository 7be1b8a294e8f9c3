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

constexpr int64_t kM = 512, kN = 4096, kK = 1024;  // a prefill chunk through a 1024 -> 4096 MLP

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
                                        const std::vector<float>& w) {
    try {
      return std::make_unique<DnnlGemm>(dt, x, w);
    } catch (const dnnl::error& e) {
      std::fprintf(stderr, "[bench] oneDNN %s matmul unavailable here: %s\n",
                   dt == dnnl::memory::data_type::bf16 ? "bf16" : "f32", e.what());
      return nullptr;
    }
  }
  DnnlGemm(dnnl::memory::data_type dt, const std::vector<float>& x, const std::vector<float>& w)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using namespace dnnl;
    using tag = memory::format_tag;
    memory::desc a_md({kM, kK}, dt, tag::ab), b_any({kK, kN}, dt, tag::any),
        c_md({kM, kN}, memory::data_type::f32, tag::ab);
    matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng_);
    memory a32({{kM, kK}, memory::data_type::f32, tag::ab}, eng_);
    memory b32({{kK, kN}, memory::data_type::f32, tag::ab}, eng_);
    std::copy(x.begin(), x.end(), static_cast<float*>(a32.get_data_handle()));
    float* pb = static_cast<float*>(b32.get_data_handle());
    for (int64_t n = 0; n < kN; ++n) {  // our W is [N, K]
      for (int64_t k = 0; k < kK; ++k) pb[k * kN + n] = w[n * kK + k];
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

GemmPeaks RunGemm(const Context& ctx, bool emit) {
  GemmPeaks peaks;
  const bool want_f32 = emit && ctx.Wants("prefill.gemm");
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(kM * kK), wf(kN * kK);
  for (float& v : x) v = dist(rng);
  for (float& v : wf) v = dist(rng) * 0.05f;
  std::vector<uint16_t> wb(kN * kK);
  for (size_t i = 0; i < wb.size(); ++i) {
    wb[i] = F32ToBf16(wf[i]);
    wf[i] = Bf16ToF32(wb[i]);  // every GEMM sees the same weight values
  }
  Weight w;
  w.data = wb.data();
  w.format = WeightFormat::kBF16;
  w.rows = kN;
  w.cols = kK;
  cpu::PackInPlace(&w);  // as the engine holds its weights
  std::vector<float> y(kM * kN);
  const double flops = 2.0 * kM * kN * kK;
  const int threads = cpu::ThreadPool::Global().num_threads();

#ifdef KIMI_BENCH_HAVE_DNNL
  const std::unique_ptr<DnnlGemm> dnnl_bf16 = DnnlGemm::Make(dnnl::memory::data_type::bf16, x, wf);
  const std::unique_ptr<DnnlGemm> dnnl_f32 = DnnlGemm::Make(dnnl::memory::data_type::f32, x, wf);
#endif
#ifdef KIMI_BENCH_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  std::vector<double> ours, ours_bf16, d_bf16, d_f32, blas, ratios, ratios_bf16, other;
  const bool want_bf16 = emit && ctx.Wants("prefill.gemm.bf16") && cpu::HasBf16DotProduct();
  const bool run_bf16 = want_bf16 || cpu::HasBf16DotProduct();  // also the bf16 roof's fallback
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    CpuMeter meter;
    double best = 0.0;
#ifdef KIMI_BENCH_HAVE_DNNL
    if (dnnl_bf16) {
      d_bf16.push_back(Rate([&] { dnnl_bf16->Run(); }, flops));
      best = std::max(best, d_bf16.back());
    }
    if (dnnl_f32) {
      d_f32.push_back(Rate([&] { dnnl_f32->Run(); }, flops));
      best = std::max(best, d_f32.back());
    }
#endif
#ifdef KIMI_BENCH_HAVE_OPENBLAS
    blas.push_back(Rate(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kM, kN, kK, 1.0f, x.data(), kK,
                      wf.data(), kK, 0.0f, y.data(), kN);
        },
        flops));
    best = std::max(best, blas.back());
#endif
    Settle();
    ours.push_back(Rate([&] { cpu::MatMul(y.data(), x.data(), w, kM); }, flops));
    if (run_bf16) {
      const cpu::ActivationScope bf16(cpu::ActivationDtype::kBf16);
      ours_bf16.push_back(Rate([&] { cpu::MatMul(y.data(), x.data(), w, kM); }, flops));
      if (!d_bf16.empty()) ratios_bf16.push_back(ours_bf16.back() / d_bf16.back());
    }
    Settle();
    other.push_back(meter.OtherFraction());
    if (best > 0) ratios.push_back(ours.back() / best);
  }
  peaks.bf16 = Median(d_bf16);
  if (peaks.bf16 == 0.0) peaks.bf16 = Median(ours_bf16);
  peaks.f32 = std::max(Median(d_f32), Median(blas));
  if (peaks.f32 == 0.0) peaks.f32 = Median(ours);  // no library: our own kernel is the roof
  if (want_f32) {
    Figure f;
    f.name = "prefill.gemm";
    f.value = Median(ours);
    f.unit = "GFLOP/s";
    const double best = std::max(peaks.bf16, std::max(Median(d_f32), Median(blas)));
    if (best > 0) {
      f.baseline = best;
      f.ratio = Median(ratios);
    }
    f.note = absl::StrFormat(
        "MatMul %ldx%ldx%ld, bf16 weights, fp32 activations, %d threads; baseline: best library "
        "GEMM",
        kM, kN, kK, threads);
    f.detail["onednn_bf16_GFLOPs"] = peaks.bf16;
    f.detail["onednn_f32_GFLOPs"] = Median(d_f32);
    f.detail["openblas_sgemm_GFLOPs"] = Median(blas);
    f.detail["ratio_to_best_fp32_activation_gemm"] =
        std::max(Median(d_f32), Median(blas)) > 0
            ? Median(ours) / std::max(Median(d_f32), Median(blas))
            : 0.0;
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
  return peaks;
}

}  // namespace kimi::bench
