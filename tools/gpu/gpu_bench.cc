// kimi-gpu-bench [--models DIR] [--filter SUBSTRING] [--quick]
// The CUDA backend's figures, one line each ("name value unit [ratio]"), every ratio against a
// baseline measured in the same run on the same GPU:
//   decode.b{1,32,128}.<model>   tokens/s of decode steps through the CUDA step runner (logits
//                                copied back, CUDA graphs on), after a 64-token prompt
//   decode.b1.<model>.hbm        bytes one batch-1 decode step reads (active weights, KDA state
//                                read+write, MLA cache) per second, as a ratio to peak HBM bandwidth
//   gemm.bf16.<M>x<N>x<K>        TFLOP/s of Gemm::Linear (bf16, pinned algorithm, including the
//                                fp32->bf16 conversion) as a ratio to cuBLASLt's fastest algorithm
//   gemm.mxfp4.grouped           TFLOP/s of the grouped MXFP4 expert GEMM (16 experts x 256 rows)
//                                as a ratio to cuBLASLt's fastest dense bf16 GEMM of the same size
//   kda.prefill.T<n>             ms of the chunked KDA kernel for one sequence of n tokens
//                                (16 heads, K = V = 128); kda.prefill.per_token_16k_over_1k
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_step_runner.h"
#include "engine/state.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kda_chunk.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/weight_gemm.h"
#include "kernels/dtype.h"
#include "tools/parse_flags.h"

ABSL_FLAG(std::string, models, "models", "directory holding the preset models");
ABSL_FLAG(std::string, filter, "", "run only figures whose name contains this");
ABSL_FLAG(bool, quick, false, "fewer repetitions and sizes");

namespace kimi {
namespace {

using cuda::CudaStatus;
using cuda::DeviceBuffer;

bool Wanted(const std::string& name) {
  const std::string f = absl::GetFlag(FLAGS_filter);
  return f.empty() || name.find(f) != std::string::npos;
}

void Print(const std::string& name, double value, const char* unit, double ratio = -1.0) {
  if (ratio >= 0) {
    std::printf("%-34s %12.3f %-8s ratio %.3f\n", name.c_str(), value, unit, ratio);
  } else {
    std::printf("%-34s %12.3f %s\n", name.c_str(), value, unit);
  }
  std::fflush(stdout);
}

void Fail(const std::string& name, const absl::Status& s) {
  std::printf("%-34s FAILED %s\n", name.c_str(), std::string(s.message()).c_str());
  std::fflush(stdout);
}

// Device buffer of n values filled from a fixed random stream.
template <typename T, typename Gen>
absl::StatusOr<DeviceBuffer> Filled(int64_t n, Gen gen) {
  std::vector<T> host(n);
  for (auto& v : host) v = gen();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(n * static_cast<int64_t>(sizeof(T)));
  if (!b.ok()) return b.status();
  KIMI_RETURN_IF_ERROR(cuda::CopyToDevice(b->get(), host.data(), n * static_cast<int64_t>(sizeof(T))));
  return b;
}

// Milliseconds per call of fn (which enqueues on `st`), after one warm-up.
template <typename Fn>
absl::StatusOr<double> TimeMs(cudaStream_t st, int reps, Fn fn) {
  KIMI_RETURN_IF_ERROR(fn());
  cudaEvent_t a = nullptr, b = nullptr;
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&a), "cudaEventCreate"));
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&b), "cudaEventCreate"));
  absl::Status s = CudaStatus(cudaEventRecord(a, st), "cudaEventRecord");
  for (int r = 0; s.ok() && r < reps; ++r) s = fn();
  if (s.ok()) s = CudaStatus(cudaEventRecord(b, st), "cudaEventRecord");
  if (s.ok()) s = CudaStatus(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0.0f;
  if (s.ok()) s = CudaStatus(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!s.ok()) return s;
  return static_cast<double>(ms) / reps;
}

// --- decode through the runner ---------------------------------------------------------------
absl::Status DecodeBench(const std::string& preset, double peak_bw) {
  const std::string dir = absl::GetFlag(FLAGS_models) + "/" + preset;
  if (!std::filesystem::exists(dir + "/config.json")) {
    std::printf("%-34s SKIPPED (%s missing)\n", ("decode.*." + preset).c_str(), dir.c_str());
    return absl::OkStatus();
  }
  auto model = Model::Load(dir);
  if (!model.ok()) return model.status();
  const ModelConfig& c = (*model)->config();
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int64_t prompt = 64, steps = quick ? 8 : 24, warm = 4, page = 16;
  const int64_t per = (prompt + warm + steps + page) / page + 1, slots = 128;
  auto runner = MakeCudaStepRunner(**model, slots, slots * per, page, 0);
  if (!runner.ok()) return runner.status();
  StepRunner& r = **runner;
  std::mt19937 rng(1);
  for (const int64_t B : {int64_t{1}, int64_t{32}, int64_t{128}}) {
    const std::string name = absl::StrCat("decode.b", B, ".", preset);
    if (!Wanted(name)) continue;
    std::vector<std::vector<int32_t>> tokens(B), pages(B);
    for (int64_t s = 0; s < B; ++s) {
      r.ops()->Apply({StateOpKind::kClearSlot, s, -1, {}});
      for (int64_t i = 0; i < prompt + warm + steps; ++i) tokens[s].push_back(static_cast<int32_t>(rng() % c.vocab));
      for (int64_t p = 0; p < per; ++p) pages[s].push_back(static_cast<int32_t>(s * per + p));
    }
    auto step = [&](int64_t pos, int64_t n, LogitsWanted want) {
      std::vector<SequenceStep> batch(B);
      for (int64_t s = 0; s < B; ++s) {
        batch[s].kda_slot = s;
        batch[s].pages = pages[s];
        batch[s].pos0 = pos;
        batch[s].tokens = std::span<const int32_t>(tokens[s].data() + pos, n);
        batch[s].logits = want;
      }
      StepOutput out;
      return r.Run(batch, &out);
    };
    KIMI_RETURN_IF_ERROR(step(0, prompt, LogitsWanted::kLast));
    for (int64_t i = 0; i < warm; ++i) KIMI_RETURN_IF_ERROR(step(prompt + i, 1, LogitsWanted::kLast));
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      KIMI_RETURN_IF_ERROR(step(prompt + warm + i, 1, LogitsWanted::kLast));
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Print(name, static_cast<double>(B * steps) / sec, "tok/s");
    if (B == 1 && Wanted(name + ".hbm")) {
      // Device step without the logits copy: bytes read per second against the peak.
      const int64_t ctx = prompt + warm + steps;
      const auto t1 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) KIMI_RETURN_IF_ERROR(step(ctx - steps + i, 1, LogitsWanted::kNone));
      const double s1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() / steps;
      const double bytes = static_cast<double>((*model)->ActiveWeightBytes()) +
                           2.0 * static_cast<double>(KdaStatePool::SlotBytes(c)) +
                           static_cast<double>(ctx) * static_cast<double>(MlaKvCache::BytesPerToken(c));
      Print(name + ".hbm", bytes / s1 / 1e9, "GB/s", peak_bw > 0 ? bytes / s1 / peak_bw : 0.0);
    }
  }
  return absl::OkStatus();
}

// --- GEMMs -----------------------------------------------------------------------------------
absl::Status GemmBench(cudaStream_t st) {
  auto gemm = cuda::Gemm::Create();
  if (!gemm.ok()) return gemm.status();
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int reps = quick ? 5 : 20;
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape sh : {Shape{4096, 4096, 4096}, Shape{128, 7168, 7168}}) {
    const std::string name = absl::StrCat("gemm.bf16.", sh.m, "x", sh.n, "x", sh.k);
    if (!Wanted(name)) continue;
    auto x = Filled<float>(sh.m * sh.k, [&] { return u(rng); });
    auto w = Filled<uint16_t>(sh.n * sh.k, [&] { return F32ToBf16(u(rng)); });
    auto xb = DeviceBuffer::Allocate(sh.m * sh.k * 2);
    auto y = DeviceBuffer::Allocate(sh.m * sh.n * 4);
    for (auto* b : {&x, &w, &xb, &y}) {
      if (!b->ok()) return b->status();
    }
    KIMI_RETURN_IF_ERROR((*gemm)->Reserve(sh.m * sh.k));
    Weight wt;
    wt.data = w->get();
    wt.format = WeightFormat::kBF16;
    wt.rows = sh.n;
    wt.cols = sh.k;
    auto ours = TimeMs(st, reps, [&] {
      return (*gemm)->Linear(y->as<float>(), sh.n, x->as<float>(), sh.k, wt, sh.m,
                             cuda::GemmPrecision::kBf16, st);
    });
    if (!ours.ok()) return ours.status();
    KIMI_RETURN_IF_ERROR(cuda::SplitToBf16(xb->as<uint16_t>(), nullptr, x->as<float>(), sh.k, sh.m, sh.k, st));
    auto best = (*gemm)->BestAlgorithmMs(y->as<float>(), xb->as<uint16_t>(), w->as<uint16_t>(), sh.n,
                                         sh.k, sh.m, reps, st);
    if (!best.ok()) return best.status();
    const double flops = 2.0 * sh.m * sh.n * sh.k;
    Print(name, flops / (*ours * 1e-3) / 1e12, "TFLOP/s", *best / *ours);
  }
  if (Wanted("gemm.mxfp4.grouped")) {
    const int64_t E = 16, rows = 256, T = E * rows, N = 3072, K = 3584;
    auto x = Filled<float>(T * K, [&] { return u(rng); });
    auto wd = Filled<uint8_t>(E * N * K / 2, [&] { return static_cast<uint8_t>(rng()); });
    auto ws = Filled<uint8_t>(E * N * K / 32, [&] { return static_cast<uint8_t>(124 + rng() % 5); });
    // Each "token" routed to one expert, tokens of expert e contiguous: the plan MoePermute makes.
    std::vector<int32_t> ids(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>(t / rows);
    const int64_t tiles = cuda::MoeMaxTiles(T, 1, E, cuda::kWeightGemmTileRows);
    auto dids = Filled<int32_t>(T, [&, i = int64_t{0}]() mutable { return ids[i++]; });
    auto plan_mem = DeviceBuffer::Allocate((E + 1 + 2 * T + 3 * tiles + 1) * 4);
    auto y = DeviceBuffer::Allocate(T * N * 4);
    auto xb = DeviceBuffer::Allocate(T * K * 2);
    auto wb = Filled<uint16_t>(N * K, [&] { return F32ToBf16(u(rng)); });
    for (auto* b : {&x, &wd, &ws, &dids, &plan_mem, &y, &xb, &wb}) {
      if (!b->ok()) return b->status();
    }
    int32_t* p = plan_mem->as<int32_t>();
    cuda::MoePlan plan{p, p + E + 1, p + E + 1 + T, p + E + 1 + 2 * T, p + E + 1 + 2 * T + tiles,
                       p + E + 1 + 2 * T + 2 * tiles, p + E + 1 + 2 * T + 3 * tiles};
    KIMI_RETURN_IF_ERROR(cuda::MoePermute(plan, dids->as<int32_t>(), T, 1, E, cuda::kWeightGemmTileRows, st));
    Weight w;
    w.data = wd->get();
    w.scales = ws->as<uint8_t>();
    w.format = WeightFormat::kMxfp4;
    w.rows = E * N;
    w.cols = K;
    auto ours = TimeMs(st, quick ? 2 : 5, [&] {
      return cuda::WeightGemmGrouped(y->as<float>(), N, x->as<float>(), K, w, N, plan.tile_group,
                                     plan.tile_row0, plan.tile_row_end, plan.num_tiles, tiles, st);
    });
    if (!ours.ok()) return ours.status();
    KIMI_RETURN_IF_ERROR(cuda::SplitToBf16(xb->as<uint16_t>(), nullptr, x->as<float>(), K, T, K, st));
    auto best = (*gemm)->BestAlgorithmMs(y->as<float>(), xb->as<uint16_t>(), wb->as<uint16_t>(), N, K,
                                         T, quick ? 5 : 20, st);
    if (!best.ok()) return best.status();
    Print("gemm.mxfp4.grouped", 2.0 * T * N * K / (*ours * 1e-3) / 1e12, "TFLOP/s", *best / *ours);
  }
  return absl::OkStatus();
}

// --- KDA prefill -----------------------------------------------------------------------------
absl::Status KdaBench(cudaStream_t st) {
  const int64_t H = 16, K = 128;
  const bool quick = absl::GetFlag(FLAGS_quick);
  std::vector<int64_t> lengths = {1024, 4096, 16384};
  if (quick) lengths = {1024, 4096};
  const int64_t Tmax = lengths.back();
  uint32_t seed = 3;
  auto lcg = [&](float lo, float hi) {
    seed = seed * 1664525u + 1013904223u;
    return lo + (hi - lo) * static_cast<float>(seed >> 8) / 16777216.0f;
  };
  auto q = Filled<float>(Tmax * H * K, [&] { return lcg(-0.09f, 0.09f); });
  auto k = Filled<float>(Tmax * H * K, [&] { return lcg(-0.09f, 0.09f); });
  auto v = Filled<float>(Tmax * H * K, [&] { return lcg(-1.0f, 1.0f); });
  auto g = Filled<float>(Tmax * H * K, [&] { return lcg(-0.1f, 0.0f); });
  auto beta = Filled<float>(Tmax * H, [&] { return lcg(0.0f, 1.0f); });
  auto o = DeviceBuffer::Allocate(Tmax * H * K * 4);
  auto state = DeviceBuffer::Zeroed(H * K * K * 4);
  const int64_t wsf = cuda::KdaChunkWorkspaceFloats(H, K, K, 64, 1);
  auto ws = DeviceBuffer::Allocate(wsf * 4);
  auto plan = Filled<int32_t>(8, [] { return 0; });
  for (auto* b : {&q, &k, &v, &g, &beta, &o, &state, &ws, &plan}) {
    if (!b->ok()) return b->status();
  }
  double first = 0.0;
  for (const int64_t T : lengths) {
    // One sequence: offset 0, count T, pos0 0, slot 0.
    const int32_t seq[4] = {0, static_cast<int32_t>(T), 0, 0};
    KIMI_RETURN_IF_ERROR(cuda::CopyToDevice(plan->get(), seq, sizeof seq));
    const int32_t* p = plan->as<int32_t>();
    cuda::DeviceBatch b;
    b.seq_offset = p;
    b.seq_count = p + 1;
    b.seq_pos0 = p + 2;
    b.seq_slot = p + 3;
    b.num_seqs = 1;
    b.num_tokens = T;
    cuda::KdaChunkArgs a;
    a.o = o->as<float>();
    a.state = state->as<float>();
    a.slot_stride = H * K * K;
    a.q = q->as<float>();
    a.k = k->as<float>();
    a.v = v->as<float>();
    a.g = g->as<float>();
    a.beta = beta->as<float>();
    a.H = H;
    a.K = K;
    a.V = K;
    a.scale = 1.0f / std::sqrt(static_cast<float>(K));
    a.workspace = ws->as<float>();
    a.workspace_floats = wsf;
    auto ms = TimeMs(st, quick ? 1 : 3, [&] { return cuda::KdaChunk(a, b, 2, st); });
    if (!ms.ok()) return ms.status();
    Print(absl::StrCat("kda.prefill.T", T), *ms, "ms");
    if (T == lengths.front()) first = *ms / T;
    if (T == 16384 && first > 0) Print("kda.prefill.per_token_16k_over_1k", *ms / T / first, "x");
  }
  return absl::OkStatus();
}

int Main() {
  if (cuda::DeviceCount() == 0) {
    std::printf("no GPU: %s\n", cuda::DescribeDevice().c_str());
    return 2;
  }
  auto info = cuda::GetDeviceInfo(0);
  if (!info.ok()) {
    std::printf("device: %s\n", std::string(info.status().message()).c_str());
    return 1;
  }
  std::printf("device %s, %d SMs, %.0f GB, peak HBM %.0f GB/s\n", info->name.c_str(), info->sm_count,
              static_cast<double>(info->memory_bytes) / 1e9, info->peak_bandwidth / 1e9);
  cudaStream_t st = nullptr;
  if (!CudaStatus(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream").ok()) return 1;
  int failures = 0;
  auto run = [&](const char* what, absl::Status s) {
    if (!s.ok()) {
      Fail(what, s);
      ++failures;
    }
  };
  for (const char* preset : {"k3-mini", "kimi-linear-small"}) {
    if (Wanted(absl::StrCat("decode.", preset)) || Wanted("decode")) {
      run(preset, DecodeBench(preset, info->peak_bandwidth));
    }
  }
  run("gemm", GemmBench(st));
  if (Wanted("kda")) run("kda", KdaBench(st));
  cudaStreamDestroy(st);
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace kimi

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(argc, argv, "CUDA backend benchmarks: one line per figure.");
  return kimi::Main();
}
