// --matmul_profile: where a decode step's MatMul time goes, shape by shape. The profile run's steps
// run once more with MatMulStats installed (two clock reads and a lock per call), and the calls are
// grouped by how they ran (split over the threads, or nested in a parallel job on one thread), the
// rows of x, the weight's shape, the number of targets and the weight format.
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/matmul.h"
#include "tools/bench/bench.h"

namespace kimi::bench {
namespace {

const char* FormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

struct Shape {
  bool nested;
  int64_t m, rows, cols;
  int targets;
  WeightFormat format;
  auto Tie() const { return std::tie(nested, m, rows, cols, targets, format); }
  bool operator<(const Shape& o) const { return Tie() < o.Tie(); }
  double Flops() const { return 2.0 * static_cast<double>(m * rows * cols); }
};

struct Calls {
  std::vector<double> seconds;
  double total = 0.0;  // the sum of `seconds`
  int64_t bytes = 0;   // weight bytes per call
};

}  // namespace

void ProfileMatMuls(const Context& ctx, const std::string& name, int steps,
                    const std::function<double()>& step) {
  if (steps <= 0) return;
  cpu::MatMulStats stats;
  cpu::SetMatMulStats(&stats);
  double step_seconds = 0.0;
  for (int i = 0; i < steps; ++i) step_seconds += step();
  cpu::SetMatMulStats(nullptr);
  step_seconds /= steps;

  std::map<Shape, Calls> by_shape;
  for (const cpu::MatMulStats::Call& c : stats.timed) {
    Calls& calls = by_shape[{c.nested, c.m, c.rows, c.cols, c.targets, c.format}];
    calls.seconds.push_back(c.seconds);
    calls.total += c.seconds;
    calls.bytes = c.bytes;
  }
  std::vector<std::pair<Shape, Calls>> rows(by_shape.begin(), by_shape.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.total > b.second.total; });

  ctx.Log(absl::StrFormat(
      "%s: MatMul time by shape, %d steps with timing on (mean step %.3f ms); 'split' calls ran "
      "over the threads, 'nested' ones inside a parallel job on one thread (their ms are thread "
      "time, side by side with others)",
      name, steps, 1e3 * step_seconds));
  ctx.Log(
      "  how     m   rows x cols  targets format  calls/step  us/call     GB/s  GFLOP/s  "
      "ms/step  of step");
  double split_s = 0.0, nested_s = 0.0;
  for (const auto& [shape, calls] : rows) {
    const double median = Median(calls.seconds), per_step = calls.total / steps;
    (shape.nested ? nested_s : split_s) += per_step;
    ctx.Log(absl::StrFormat("  %-6s %4d %6d x %-5d %7d %-6s %11.1f %8.2f %8.1f %8.1f %8.3f %8.3f",
                            shape.nested ? "nested" : "split", shape.m, shape.rows, shape.cols,
                            shape.targets, FormatName(shape.format),
                            static_cast<double>(calls.seconds.size()) / steps, 1e6 * median,
                            static_cast<double>(calls.bytes) / median / 1e9,
                            shape.Flops() / median / 1e9, 1e3 * per_step, per_step / step_seconds));
  }
  ctx.Log(absl::StrFormat(
      "  split MatMuls %.3f ms per step (%.3f of it); nested MatMuls %.3f thread-ms per step",
      1e3 * split_s, split_s / step_seconds, 1e3 * nested_s));
}

}  // namespace kimi::bench
