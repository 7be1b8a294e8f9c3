// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/state.h"
#include "engine/synthetic_model.h"
#include "kernels/cpu/thread_pool.h"
#include "tools/bench/bench.h"
#include <immintrin.h>
#include <sys/resource.h>
#include <unistd.h>

namespace kimi::bench {

bool Context::Wants(const std::string& name) const {
  return !filter || std::regex_search(name, *filter);
}

bool Context::WantsAny(const std::vector<std::string>& names) const {
  for (const std::string& n : names) {
    if (Wants(n)) return true;
  }
  return false;
}

std::string Context::PrefillName(const std::string& preset) const {
  return absl::StrCat("prefill.", prefill_tokens, ".", preset);
}

std::string HostCpu() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model;
  auto value = [&](const char* key, std::string* out) {
    if (!out->empty() || line.rfind(key, 0) != 0) return;
    const size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) *out = line.substr(colon + 2);
  };
  while (std::getline(in, line) && (name.empty() || family.empty() || model.empty())) {
    value("model name", &name);
    value("cpu family", &family);
    if (line.rfind("model\t", 0) == 0) value("model", &model);
  }
  if (name.empty()) return "unknown cpu";
  return family.empty() ? name : absl::StrCat(name, " (family ", family, ", model ", model, ")");
}

void Context::Log(const std::string& line) const { std::fprintf(stderr, "[bench] %s\n", line.c_str()); }

void Context::Emit(const Figure& f) const {
  if (json) {
    nlohmann::ordered_json j;
    j["name"] = f.name;
    j["value"] = f.value;
    j["unit"] = f.unit;
    j["baseline"] = f.baseline ? nlohmann::ordered_json(*f.baseline) : nlohmann::ordered_json();
    j["ratio"] = f.ratio ? nlohmann::ordered_json(*f.ratio) : nlohmann::ordered_json();
    if (!f.baseline_unit.empty()) j["baseline_unit"] = f.baseline_unit;
    j["note"] = f.note;
    j["detail"] = f.detail;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string base = "-", ratio = "-";
    if (f.baseline) {
      base = absl::StrCat(absl::StrFormat("%.4g", *f.baseline), " ",
                          f.baseline_unit.empty() ? f.unit : f.baseline_unit);
    }
    if (f.ratio) ratio = absl::StrFormat("%.3f", *f.ratio);
    std::printf("%-40s %12.4g %-8s baseline %-18s ratio %-7s  %s\n", f.name.c_str(), f.value,
                f.unit.c_str(), base.c_str(), ratio.c_str(), f.note.c_str());
  }
  std::fflush(stdout);
}

int64_t MinorPageFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Figure MedianFigure(std::string name, std::string unit, const std::vector<double>& values,
                    const std::vector<double>& baselines, const std::vector<double>& ratios) {
  Figure f;
  f.name = std::move(name);
  f.value = Median(values);
  f.unit = std::move(unit);
  f.baseline = Median(baselines);
  f.ratio = Median(ratios);
  return f;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

int64_t MachineBusyTicks() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
  return user + nice + sys + irq + softirq + steal;
}

int64_t OwnTicks() {
  std::ifstream in("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string f;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> f; ++i) {
    if (i == 14) utime = std::stoll(f);
    if (i == 15) stime = std::stoll(f);
  }
  return utime + stime;
}

}  // namespace

CpuMeter::CpuMeter() : t0_(Now()), busy0_(MachineBusyTicks()), own0_(OwnTicks()) {}

double CpuMeter::OtherFraction() const {
  const double wall = Now() - t0_;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double cpus = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
  const double other = static_cast<double>((MachineBusyTicks() - busy0_) - (OwnTicks() - own0_));
  return wall > 0 ? std::max(0.0, other / hz / (wall * cpus)) : 0.0;
}

double WaitForIdle(double max_s) {
  const double deadline = Now() + max_s;
  double idle = 0.0;
  do {
    CpuMeter m;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    idle = 1.0 - m.OtherFraction();
    if (idle >= 0.9) break;
  } while (Now() < deadline);
  return idle;
}

namespace {

// The reads touch one line of each 4 KiB page 64 KiB ahead, as the matmul kernels do
// (kPageAheadBytes, kernels/cpu/matmul_impl.h), so that the baseline is the best streaming read
// we know and the kernels are not measured against a weaker one. On the Zen 5 host (a virtual
// machine) a plain read stalled on a page walk every 4 KiB: over 1 GiB on huge pages, 1 thread
// 18-31 GB/s plain against 37-40 with the touch, 2 threads 26-29 against 42.
constexpr size_t kPageAhead = 64 << 10;

__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    if (i % 4096 == 0) _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPageAhead, _MM_HINT_T0);
    a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_loadu_si512(p + i + 192));
  }
  uint64_t s = 0;
  for (; i < n; ++i) s += p[i];
  // Summed as uint64_t lanes, as ReadAvx2 does: GCC's _mm512_reduce_add_epi64 adds its lanes as
  // signed long long, which overflowed (undefined; UBSan stopped kimi-bench) on these xors.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d)));
  for (const uint64_t lane : lanes) s += lane;
  return s;
}

__attribute__((target("avx2"))) uint64_t ReadAvx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    if (i % 4096 == 0) _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPageAhead, _MM_HINT_T0);
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  uint64_t s = 0;
  for (; i < n; ++i) s += p[i];
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
  return s + lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Each 64-byte line loaded and stored back unchanged (the store dirties it, so it is written back;
// the empty asm keeps the compiler from dropping a store of what was just loaded).
__attribute__((target("avx512f"))) void ReadWriteAvx512(uint8_t* p, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    if (i % 4096 == 0) _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPageAhead, _MM_HINT_T0);
    __m512i v = _mm512_loadu_si512(p + i);
    asm volatile("" : "+v"(v));
    _mm512_storeu_si512(p + i, v);
  }
}
__attribute__((target("avx2"))) void ReadWriteAvx2(uint8_t* p, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    if (i % 4096 == 0) _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPageAhead, _MM_HINT_T0);
    auto* v = reinterpret_cast<__m256i*>(p + i);
    __m256i a = _mm256_loadu_si256(v), b = _mm256_loadu_si256(v + 1);
    asm volatile("" : "+v"(a), "+v"(b));
    _mm256_storeu_si256(v, a);
    _mm256_storeu_si256(v + 1, b);
  }
}

volatile uint64_t g_sink;

// Thread t's share [first, second) of n bytes split over `threads`: whole 64-byte lines, the last
// share taking what is left.
std::pair<size_t, size_t> LineShare(size_t n, int64_t t, int threads) {
  const size_t lo = n * t / threads & ~size_t{63};
  const size_t hi = t + 1 == threads ? n : n * (t + 1) / threads & ~size_t{63};
  return {lo, hi};
}

// Passes of `pass` over `bytes` until at least 3 and 0.3 s (at most 50): the median GB/s.
template <class F>
double MedianPassGBps(double bytes, const F& pass) {
  pass();  // warm-up (faults in anything not yet mapped)
  std::vector<double> gbps;
  const double start = Now();
  do {
    const double t0 = Now();
    pass();
    gbps.push_back(bytes / (Now() - t0) / 1e9);
  } while (gbps.size() < 3 || (Now() - start < 0.3 && gbps.size() < 50));
  return Median(gbps);
}

}  // namespace

double StreamReadGBps(const std::vector<std::span<const uint8_t>>& regions, int threads) {
  auto& pool = cpu::ThreadPool::Global();
  pool.SetActiveThreads(threads);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  size_t total = 0;
  for (const auto& r : regions) total += r.size();
  const auto pass = [&] {
    uint64_t sums[64] = {};
    pool.ParallelFor(pool.num_threads(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        uint64_t s = 0;
        for (const auto& r : regions) {
          const auto [lo, hi] = LineShare(r.size(), t, pool.num_threads());
          s += avx512 ? ReadAvx512(r.data() + lo, hi - lo) : ReadAvx2(r.data() + lo, hi - lo);
        }
        sums[t % 64] += s;
      }
    });
    g_sink = sums[0] + sums[1];
  };
  const double gbps = MedianPassGBps(static_cast<double>(total), pass);
  pool.SetActiveThreads(0);
  return gbps;
}

double StreamReadWriteGBps(int64_t bytes, int threads) {
  auto& pool = cpu::ThreadPool::Global();
  pool.SetActiveThreads(threads);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  // At least 1 GiB, more than the last-level cache holds (480 MiB on the AMX host): a step streams
  // its weights between two passes over the states, so they come from memory. There a 54-161 MB
  // buffer read and written right after a 1 GB read moved 52-53 GB/s; passed over again and again
  // on its own, 43-99 (partly from the cache). Kept across calls: its first touch is a page fault
  // per 4 KiB.
  static std::unique_ptr<ZeroedBuffer> buffer;
  const int64_t floats = (std::max<int64_t>(bytes, int64_t{1} << 30) + 3) / 4;
  if (!buffer || buffer->size() < floats) buffer = std::make_unique<ZeroedBuffer>(floats);
  auto* data = reinterpret_cast<uint8_t*>(buffer->data());
  const size_t n = static_cast<size_t>(floats) * sizeof(float);
  const auto pass = [&] {
    pool.ParallelFor(pool.num_threads(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const auto [lo, hi] = LineShare(n, t, pool.num_threads());
        avx512 ? ReadWriteAvx512(data + lo, hi - lo) : ReadWriteAvx2(data + lo, hi - lo);
      }
    });
  };
  const double gbps = MedianPassGBps(2.0 * static_cast<double>(n), pass);
  pool.SetActiveThreads(0);
  return gbps;
}

std::unique_ptr<Model> LoadPreset(const Context& ctx, const std::string& preset) {
  namespace fs = std::filesystem;
  const std::string dir = ctx.models_dir + "/" + preset;
  if (!fs::exists(dir + "/config.json")) {
    SyntheticOptions o;
    o.preset = preset;
    o.out_dir = dir;
    o.seed = 1;
    o.tiktoken_path = !ctx.tiktoken.empty() ? ctx.tiktoken
                      : fs::exists(ctx.models_dir + "/cl100k_base.tiktoken")
                          ? ctx.models_dir + "/cl100k_base.tiktoken"
                          : "";
    ctx.Log(absl::StrCat("generating ", dir, o.tiktoken_path.empty() ? " (byte vocabulary)" : ""));
    if (absl::Status s = WriteSyntheticModel(o); !s.ok()) {
      ctx.Log(absl::StrCat("cannot generate ", preset, ": ", s.message()));
      return nullptr;
    }
  }
  Model::Options opts;
  if (!ctx.weight_memory.empty() && !ParseWeightMemory(ctx.weight_memory, &opts.memory)) {
    ctx.Log(absl::StrCat("unknown --weight_memory ", ctx.weight_memory));
    return nullptr;
  }
  // A figure measured on mapped weights is not the default's: say so when the copy did not fit.
  bool mapped_instead = false;
  opts.log = [&](const std::string& line) {
    if (line.find("would not fit") == std::string::npos) return;
    mapped_instead = true;
    ctx.Log(line);
  };
  const double t0 = Now();
  auto m = Model::Load(dir, opts);
  if (!m.ok()) {
    ctx.Log(absl::StrCat("cannot load ", dir, ": ", m.status().message()));
    return nullptr;
  }
  ctx.Log(absl::StrFormat(
      "loaded %s (%s) in %.1f s", dir,
      mapped_instead ? "map: the copy did not fit" : WeightMemoryName(opts.memory), Now() - t0));
  (*m)->SetKdaStateDtype(ctx.kda_state_dtype);
  return std::move(*m);
}

}  // namespace kimi::bench
