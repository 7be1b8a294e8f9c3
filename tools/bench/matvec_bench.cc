// matvec.mxfp4: one token (m = 1) through a packed MXFP4 weight, the product that dominates MoE
// experts at batch 1. value = packed bytes (codes + scales) / median time, in the layout this
// machine packs MXFP4 in (kernels/cpu/pack.h); baseline = streaming read of the same bytes, same
// rounds; ratio = value / baseline. The detail gives the block layout's rate from the same rounds
// (the layout AVX-512 machines use), so a layout change is measured against the old one.
//
// matvec.bf16: one token through packed bf16 weights as wide as a published K3's hidden size
// (7168): kBf16Count matrices of kBf16Rows x 7168 read in turn, one MatMul each, as a decode step
// reads its projections, from memory (they total several times any L3 here). value = bytes / median
// pass time; baseline = streaming read of the same bytes, same rounds. The detail gives the rate
// with bf16 activations from the same rounds, where the machine has the bf16 dot product.
//
// experts.mxfp4: a decode step's routed experts alone: kExperts experts of k3-mini's shape (gate
// and up kExpertIntermediate x kExpertDim, down kExpertDim x kExpertIntermediate, MXFP4 packed as
// this machine packs it), each at one x row, the threads taking experts in turn side by side, each
// expert's products on one thread, as the MoE layer runs a decode step's experts (engine/ffn.cc;
// without its gather of rows, its GLU and its shared experts). value = packed bytes / pass time;
// baseline = streaming read of the same bytes, same rounds. The detail gives the time an expert
// takes a thread, and the same pass at kExpertRowsWide x rows (batch 32's mean rows an expert in
// k3-mini), where the decode of each block serves more rows.
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"
#include "tools/bench/bench.h"
#include <sys/mman.h>

namespace kimi::bench {
namespace {

constexpr int64_t kRows = 32768, kCols = 2048;  // 34 MB of codes: beyond the L3 of the hosts here
constexpr int64_t kBf16Rows = 2048, kBf16Cols = 7168, kBf16Count = 8;  // 8 x 29 MB
// 1024 experts of 102 KiB packed (102 MiB): beyond the L3 of the Zen hosts (the Xeon's L3 may
// hold them; the read baseline then reads them from there too).
constexpr int64_t kExperts = 1024, kExpertDim = 256, kExpertIntermediate = 256;
constexpr int64_t kExpertRowsWide = 4;

uint8_t* AllocHuge(int64_t bytes) {
  constexpr int64_t kHuge = int64_t{2} << 20;
  const int64_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, rounded));
  madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}
struct Free {
  void operator()(uint8_t* p) const { std::free(p); }
};

const char* LayoutName(PackLayout l) {
  switch (l) {
    case PackLayout::kBlocks:
      return "blocks";
    case PackLayout::kLanes:
      return "lanes";
    case PackLayout::kPairs:
      return "pairs";
    case PackLayout::kTiles:
      return "tiles";
  }
  return "?";
}

// Pseudo-random MXFP4 codes (a linear congruential stream carried in `seed`) and scales near 1.
void FillMxfp4(uint8_t* codes, int64_t code_bytes, uint8_t* scales, int64_t scale_bytes,
               uint32_t& seed) {
  for (int64_t i = 0; i < code_bytes; ++i) {
    seed = seed * 1664525u + 1013904223u;
    codes[i] = static_cast<uint8_t>(seed >> 24);
  }
  for (int64_t i = 0; i < scale_bytes; ++i) scales[i] = static_cast<uint8_t>(124 + i % 6);
}

// An activation row of values in [-0.5, 0.5), the same for every figure.
std::vector<float> ActivationRow(int64_t n) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  return x;
}

// A [kRows, kCols] MXFP4 weight in 2 MiB-aligned, huge-page-advised memory (as the model loader
// places weights), with pseudo-random codes and scales near 1, packed in `layout`.
struct Mxfp4Matrix {
  std::unique_ptr<uint8_t, Free> codes, scales;
  Weight w;

  explicit Mxfp4Matrix(PackLayout layout) {
    codes.reset(AllocHuge(kRows * kCols / 2));
    scales.reset(AllocHuge(kRows * kCols / 32));
    uint32_t seed = 12345;
    FillMxfp4(codes.get(), kRows * kCols / 2, scales.get(), kRows * kCols / 32, seed);
    w.data = codes.get();
    w.scales = scales.get();
    w.format = WeightFormat::kMxfp4;
    w.rows = kRows;
    w.cols = kCols;
    cpu::PackInPlace(&w, layout);
  }
  std::vector<std::span<const uint8_t>> Regions() const {
    return {{codes.get(), static_cast<size_t>(w.DataBytes())},
            {scales.get(), static_cast<size_t>(w.ScaleBytes())}};
  }
};

// A packed [kBf16Rows, kBf16Cols] bf16 weight with values near 1, in huge-page-advised memory.
struct Bf16Matrix {
  std::unique_ptr<uint8_t, Free> data;
  Weight w;

  explicit Bf16Matrix(uint32_t seed) {
    data.reset(AllocHuge(kBf16Rows * kBf16Cols * 2));
    auto* v = reinterpret_cast<uint16_t*>(data.get());
    for (int64_t i = 0; i < kBf16Rows * kBf16Cols; ++i) {
      seed = seed * 1664525u + 1013904223u;
      v[i] = static_cast<uint16_t>(0x3f00 + (seed >> 25));
    }
    w.data = data.get();
    w.format = WeightFormat::kBF16;
    w.rows = kBf16Rows;
    w.cols = kBf16Cols;
    cpu::PackInPlace(&w);
  }
};

// kExperts experts' gate, up and down projections in one huge-page-advised region, pseudo-random
// codes and scales near 1, packed as this machine packs MXFP4.
struct Mxfp4Experts {
  std::unique_ptr<uint8_t, Free> memory;
  int64_t bytes = 0;
  std::vector<Weight> gate, up, down;

  Mxfp4Experts() {
    const auto shape = [](int64_t rows, int64_t cols) {
      Weight w;
      w.format = WeightFormat::kMxfp4;
      w.rows = rows;
      w.cols = cols;
      return w;
    };
    bytes = kExperts * (2 * shape(kExpertIntermediate, kExpertDim).Bytes() +
                        shape(kExpertDim, kExpertIntermediate).Bytes());
    memory.reset(AllocHuge(bytes));
    uint8_t* next = memory.get();
    uint32_t seed = 777;
    const auto make = [&](int64_t rows, int64_t cols) {
      Weight w = shape(rows, cols);
      auto* codes = next;
      next += w.DataBytes();
      auto* scales = next;
      next += w.ScaleBytes();
      FillMxfp4(codes, w.DataBytes(), scales, w.ScaleBytes(), seed);
      w.data = codes;
      w.scales = scales;
      cpu::PackInPlace(&w);
      return w;
    };
    for (int64_t e = 0; e < kExperts; ++e) {
      gate.push_back(make(kExpertIntermediate, kExpertDim));
      up.push_back(make(kExpertIntermediate, kExpertDim));
      down.push_back(make(kExpertDim, kExpertIntermediate));
    }
    assert(next == memory.get() + bytes);
  }

  // Every expert at m x rows (x [m, kExpertDim]), `threads` threads taking experts in turn; a
  // part of the pool that finds none left returns at once.
  void Pass(const float* x, int64_t m, int threads) const {
    std::atomic<int64_t> taken{0};
    cpu::ThreadPool::Global().ParallelFor(threads, 1, [&](int64_t, int64_t) {
      // [2][m, kExpertIntermediate]: gate's rows, then up's; down reads gate's (no GLU here).
      std::vector<float> hidden(2 * m * kExpertIntermediate), out(m * kExpertDim);
      for (int64_t e; (e = taken.fetch_add(1, std::memory_order_relaxed)) < kExperts;) {
        const cpu::MatMulTarget targets[] = {
            {hidden.data(), kExpertIntermediate, &gate[e]},
            {hidden.data() + m * kExpertIntermediate, kExpertIntermediate, &up[e]}};
        cpu::MatMulMany(targets, x, kExpertDim, m);
        cpu::MatMul(out.data(), hidden.data(), down[e], m);
      }
    });
  }
};

void RunExpertsMxfp4(const Context& ctx) {
  if (!ctx.Wants("experts.mxfp4") || ctx.profile_steps > 0) return;
  const Mxfp4Experts experts;
  const std::vector<std::span<const uint8_t>> regions = {
      {experts.memory.get(), static_cast<size_t>(experts.bytes)}};
  const int threads = cpu::ThreadPool::Global().num_threads();
  const std::vector<float> x = ActivationRow(kExpertRowsWide * kExpertDim);
  const double bytes = static_cast<double>(experts.bytes);
  constexpr int kReps = 3;
  const auto seconds = [&](int64_t m) {
    return MedianSeconds(kReps, [&] { experts.Pass(x.data(), m, threads); });
  };
  seconds(1);  // first touch
  std::vector<double> bw, gbps, ratios, us_one, wide_gbps, wide_ratios;
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    bw.push_back(StreamReadGBps(regions, threads));
    const double one = seconds(1);
    gbps.push_back(bytes / one / 1e9);
    ratios.push_back(gbps.back() / bw.back());
    us_one.push_back(one * 1e6 * threads / kExperts);
    wide_gbps.push_back(bytes / seconds(kExpertRowsWide) / 1e9);
    wide_ratios.push_back(wide_gbps.back() / bw.back());
  }
  Figure f = MedianFigure("experts.mxfp4", "GB/s", gbps, bw, ratios);
  f.note = absl::StrFormat(
      "packed MXFP4 bytes / time, %lld experts (gate, up %lld x %lld, down %lld x %lld) at m = 1, "
      "one expert a thread at a time, %d thread(s); baseline: streaming read",
      static_cast<long long>(kExperts), static_cast<long long>(kExpertIntermediate),
      static_cast<long long>(kExpertDim), static_cast<long long>(kExpertDim),
      static_cast<long long>(kExpertIntermediate), threads);
  f.detail["threads"] = threads;
  f.detail["us_per_expert_per_thread"] = Median(us_one);
  f.detail["rows_wide"] = kExpertRowsWide;
  f.detail["wide_GBps"] = Median(wide_gbps);
  f.detail["wide_ratio"] = Median(wide_ratios);
  f.detail["per_round_ratio"] = ratios;
  f.detail["per_round_bw_GBps"] = bw;
  f.detail["isa"] = cpu::IsaName(cpu::MatMulIsa());
  ctx.Emit(f);
}

void RunMatvecBf16(const Context& ctx) {
  if (!ctx.Wants("matvec.bf16") || ctx.profile_steps > 0) return;
  std::vector<std::unique_ptr<Bf16Matrix>> ms;
  std::vector<std::span<const uint8_t>> regions;
  for (int i = 0; i < kBf16Count; ++i) {
    ms.push_back(std::make_unique<Bf16Matrix>(1000 + i));
    regions.push_back({ms.back()->data.get(), static_cast<size_t>(ms.back()->w.Bytes())});
  }
  const int threads = cpu::ThreadPool::Global().num_threads();
  const std::vector<float> x = ActivationRow(kBf16Cols);
  std::vector<float> y(kBf16Rows);
  const double bytes = static_cast<double>(kBf16Count) * ms[0]->w.Bytes();
  const auto rate = [&](cpu::ActivationDtype activations) {
    cpu::ActivationScope scope(activations);
    return bytes /
           MedianSeconds(5,
                         [&] {
                           for (const auto& m : ms) cpu::MatMul(y.data(), x.data(), m->w, 1);
                         }) /
           1e9;
  };
  rate(cpu::ActivationDtype::kF32);  // first touch
  // The opt-in bf16 activations (kernels/cpu/matmul.h) where the machine has the dot product.
  const bool bf16 = cpu::HasBf16DotProduct();
  std::vector<double> bw, gbps, ratios, bf16_gbps, bf16_ratios;
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    bw.push_back(StreamReadGBps(regions, threads));
    gbps.push_back(rate(cpu::ActivationDtype::kF32));
    ratios.push_back(gbps.back() / bw.back());
    if (bf16) {
      bf16_gbps.push_back(rate(cpu::ActivationDtype::kBf16));
      bf16_ratios.push_back(bf16_gbps.back() / bw.back());
    }
  }
  Figure f = MedianFigure("matvec.bf16", "GB/s", gbps, bw, ratios);
  f.note = absl::StrFormat(
      "packed bf16 bytes / time, m = 1, %d matrices of %lld x %lld read in turn, %d thread(s); "
      "baseline: streaming read",
      static_cast<int>(kBf16Count), static_cast<long long>(kBf16Rows),
      static_cast<long long>(kBf16Cols), threads);
  f.detail["threads"] = threads;
  f.detail["per_round_ratio"] = ratios;
  f.detail["per_round_bw_GBps"] = bw;
  if (bf16) {
    f.detail["bf16_activations_GBps"] = Median(bf16_gbps);
    f.detail["bf16_activations_ratio"] = Median(bf16_ratios);
  }
  f.detail["isa"] = cpu::IsaName(cpu::MatMulIsa());
  ctx.Emit(f);
}

}  // namespace

void RunMatvec(const Context& ctx) {
  RunMatvecBf16(ctx);
  RunExpertsMxfp4(ctx);
  if (!ctx.Wants("matvec.mxfp4") || ctx.profile_steps > 0) return;
  const PackLayout preferred = cpu::PreferredPackLayout(WeightFormat::kMxfp4);
  const Mxfp4Matrix ours(preferred), blocks(PackLayout::kBlocks);
  const int threads = cpu::ThreadPool::Global().num_threads();
  const std::vector<float> x = ActivationRow(kCols);
  std::vector<float> y(kRows);
  const double bytes = static_cast<double>(ours.w.Bytes());
  constexpr int kReps = 10;
  const auto rate = [&](const Weight& w) {
    return bytes / MedianSeconds(kReps, [&] { cpu::MatMul(y.data(), x.data(), w, 1); }) / 1e9;
  };
  rate(ours.w);  // first touch
  rate(blocks.w);
  std::vector<double> bw, ours_gbps, blocks_gbps, ratios, block_ratios;
  for (int r = 0; r < ctx.repeats; ++r) {
    WaitForIdle(ctx.idle_wait_s);
    bw.push_back(StreamReadGBps(ours.Regions(), threads));
    ours_gbps.push_back(rate(ours.w));
    blocks_gbps.push_back(rate(blocks.w));
    ratios.push_back(ours_gbps.back() / bw.back());
    block_ratios.push_back(blocks_gbps.back() / bw.back());
  }
  Figure f = MedianFigure("matvec.mxfp4", "GB/s", ours_gbps, bw, ratios);
  f.note = absl::StrFormat(
      "packed MXFP4 bytes / time, m = 1, %lld x %lld, %s layout, %d thread(s); baseline: "
      "streaming read",
      static_cast<long long>(kRows), static_cast<long long>(kCols), LayoutName(preferred), threads);
  f.detail["layout"] = LayoutName(preferred);
  f.detail["threads"] = threads;
  f.detail["blocks_layout_GBps"] = Median(blocks_gbps);
  f.detail["blocks_layout_ratio"] = Median(block_ratios);
  f.detail["speedup_over_blocks"] = Median(ours_gbps) / Median(blocks_gbps);
  f.detail["per_round_ratio"] = ratios;
  f.detail["isa"] = cpu::IsaName(cpu::MatMulIsa());
  ctx.Emit(f);
}

}  // namespace kimi::bench
