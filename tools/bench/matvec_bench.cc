// matvec.mxfp4: one token (m = 1) through a packed MXFP4 weight, the product that dominates MoE
// experts at batch 1. value = packed bytes (codes + scales) / median time, in the layout this
// machine packs MXFP4 in (kernels/cpu/pack.h); baseline = streaming read of the same bytes, same
// rounds; ratio = value / baseline. The detail gives the block layout's rate from the same rounds
// (the layout AVX-512 machines use), so a layout change is measured against the old one.
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

const char* LayoutName(PackLayout l) {
  switch (l) {
    case PackLayout::kBlocks:
      return "blocks";
    case PackLayout::kLanes:
      return "lanes";
    case PackLayout::kPairs:
      return "pairs";
  }
  return "?";
}

// A [kRows, kCols] MXFP4 weight in 2 MiB-aligned, huge-page-advised memory (as the model loader
// places weights), with pseudo-random codes and scales near 1, packed in `layout`.
struct Mxfp4Matrix {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> codes, scales;
  Weight w;

  static uint8_t* Alloc(int64_t bytes) {
    constexpr int64_t kHuge = int64_t{2} << 20;
    const int64_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, rounded));
    madvise(p, rounded, MADV_HUGEPAGE);
    return p;
  }
  explicit Mxfp4Matrix(PackLayout layout) {
    codes.reset(Alloc(kRows * kCols / 2));
    scales.reset(Alloc(kRows * kCols / 32));
    uint32_t s = 12345;
    for (int64_t i = 0; i < kRows * kCols / 2; ++i) {
      s = s * 1664525u + 1013904223u;
      codes.get()[i] = static_cast<uint8_t>(s >> 24);
    }
    for (int64_t i = 0; i < kRows * kCols / 32; ++i) scales.get()[i] = 124 + i % 6;
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

}  // namespace

void RunMatvec(const Context& ctx) {
  if (!ctx.Wants("matvec.mxfp4") || ctx.profile_steps > 0) return;
  const PackLayout preferred = cpu::PreferredPackLayout(WeightFormat::kMxfp4);
  const Mxfp4Matrix ours(preferred), blocks(PackLayout::kBlocks);
  const int threads = cpu::ThreadPool::Global().num_threads();
  std::vector<float> x(kCols), y(kRows);
  for (int64_t i = 0; i < kCols; ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  const double bytes = static_cast<double>(ours.w.Bytes());
  constexpr int kReps = 10;
  const auto rate = [&](const Weight& w) {
    std::vector<double> t;
    for (int i = 0; i < kReps; ++i) {
      const double t0 = Now();
      cpu::MatMul(y.data(), x.data(), w, 1);
      t.push_back(Now() - t0);
    }
    return bytes / Median(t) / 1e9;
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
  Figure f;
  f.name = "matvec.mxfp4";
  f.value = Median(ours_gbps);
  f.unit = "GB/s";
  f.baseline = Median(bw);
  f.ratio = Median(ratios);
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
