// kimi-bench internals: figures, the run context, timing and machine-baseline helpers.
//
// Every figure is printed with a baseline measured in the same run (memory bandwidth over the
// weights' own pages, the best library GEMM, ...), so a figure is a ratio that survives a noisy,
// shared machine. Timings are medians over --repeats rounds; baselines and the measured code
// alternate inside each round.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "engine/weights.h"
#include "nlohmann/json.hpp"

namespace kimi::bench {

struct Figure {
  std::string name;
  double value = 0.0;
  std::string unit;
  std::optional<double> baseline;  // same unit as value unless `baseline_unit` says otherwise
  std::optional<double> ratio;
  std::string baseline_unit;       // empty: same as unit
  std::string note;                // one line: what value, baseline and ratio are
  nlohmann::ordered_json detail = nlohmann::ordered_json::object();
};

// A figure measured in rounds against a baseline of the same rounds: value, baseline and ratio are
// the medians of the per-round values, baselines and ratios.
Figure MedianFigure(std::string name, std::string unit, const std::vector<double>& values,
                    const std::vector<double>& baselines, const std::vector<double>& ratios);

struct Context {
  std::string models_dir;
  std::string tiktoken;
  std::string weight_memory;  // empty: the engine default
  KdaStateDtype kda_state_dtype = KdaStateDtype::kF32;  // the loaded models' (--kda_state_dtype)
  int repeats = 5;
  bool json = false;
  double idle_wait_s = 20.0;
  // > 0: the batched decode figures only run this many steps and print their median time, with
  // no baselines (a quiet loop for perf record).
  int profile_steps = 0;
  // With profile_steps: run the steps once more with MatMul timing on and print the time by shape.
  bool matmul_profile = false;
  // The prompt length of the prefill.<N>.<model> figures.
  int prefill_tokens = 512;
  std::string PrefillName(const std::string& preset) const;
  std::optional<std::regex> filter;
  std::vector<std::string> commands;  // the command line, for the report

  bool Wants(const std::string& name) const;
  bool WantsAny(const std::vector<std::string>& names) const;
  void Emit(const Figure& f) const;
  void Log(const std::string& line) const;  // stderr progress
};

// The processor, from /proc/cpuinfo: "AMD EPYC (family 25, model 17)" here; "unknown cpu" where it
// cannot be read. Runs are only comparable on one kind of host (benchmarks/README.md).
std::string HostCpu();

// --- timing ------------------------------------------------------------------------------------
double Now();
// Minor page faults of the process so far (getrusage).
int64_t MinorPageFaults();
double Median(std::vector<double> v);
// Median seconds of `reps` calls of fn().
template <class F>
double MedianSeconds(int reps, const F& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = Now();
    fn();
    t.push_back(Now() - t0);
  }
  return Median(t);
}

// Machine CPU used by other processes while a measurement ran, as a fraction of all cores.
class CpuMeter {
 public:
  CpuMeter();
  double OtherFraction() const;  // since construction

 private:
  double t0_;
  int64_t busy0_, own0_;
};

// Waits (up to `max_s`) until the machine was >= 90% idle over a 0.5 s window. Returns the idle
// fraction seen last.
double WaitForIdle(double max_s);

// --- memory ------------------------------------------------------------------------------------
// Streams over the regions with `threads` threads of the kernel pool (each takes a contiguous
// share of every region, as MatMul does with a weight matrix). Returns GB/s (1e9 B/s).
double StreamReadGBps(const std::vector<std::span<const uint8_t>>& regions, int threads);
// Reads and writes back every line of a buffer of `bytes` (at least 1 GiB, so that it comes from
// memory) with `threads` threads (each a contiguous share), in memory allocated as the KDA state
// pool's (engine/state.h): what a batched step's recurrence does to the states. Returns GB/s of
// bytes moved, read plus written.
double StreamReadWriteGBps(int64_t bytes, int threads);

// --- models ------------------------------------------------------------------------------------
// models_dir/preset, generated there (kimi-mkmodel's generator, seed 1) when missing.
std::unique_ptr<Model> LoadPreset(const Context& ctx, const std::string& preset);

// --- figure groups (each emits the figures it measures that the filter wants) -------------------
// The best GEMM on this machine, measured on demand over a prefill-shaped product: oneDNN matmul
// (bf16, f32) and OpenBLAS sgemm where the build found them, else our own MatMul. A figure whose
// roof is a GEMM rate measures it in each of its own rounds: on a shared host the core clock, not
// only the memory bandwidth, changes by the minute (a dependent add chain ran at 1.4 and at 3.5
// GHz within an hour on the Zen 5 host).
class GemmPeakMeter {
 public:
  // The product: 512 rows (a prefill chunk) through a 4096 x k bf16 weight.
  explicit GemmPeakMeter(int64_t k = 1024);
  ~GemmPeakMeter();
  GemmPeakMeter(const GemmPeakMeter&) = delete;
  GemmPeakMeter& operator=(const GemmPeakMeter&) = delete;
  // GFLOP/s now with bf16 or fp32 activations (about a second, libraries settled afterwards).
  double Measure(bool bf16);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend void RunGemm(const Context& ctx, GemmPeakMeter& meter);
};
void RunGemm(const Context& ctx, GemmPeakMeter& meter);
void RunDecode(const Context& ctx, const std::string& preset, GemmPeakMeter* meter);
void RunAttentionScaling(const Context& ctx);
void RunMlaDecode(const Context& ctx);
void RunState(const Context& ctx);
void RunSchedulerOverhead(const Context& ctx, const std::string& preset);
void RunMatvec(const Context& ctx);

// Runs `steps` calls of step() (each returns its seconds) with MatMulStats installed and logs
// where their MatMul time went, by shape (matmul_profile.cc).
void ProfileMatMuls(const Context& ctx, const std::string& name, int steps,
                    const std::function<double()>& step);

}  // namespace kimi::bench
