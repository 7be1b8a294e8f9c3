#include "scheduler/sampling.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "kernels/cpu/matmul.h"
#include "scheduler/exp_sum_avx512.h"

namespace kimi::sched {
namespace {

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ExpNonPositive's polynomial, for F = float or 16 lanes of it (ExpNonPositive16): p = exp(r).
template <class F>
inline __attribute__((always_inline)) void ExpTaylor7(const F& r, F& p) {
  p = F{} + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
}

// exp(x) for x <= 0 in float: round-to-nearest range reduction x = n ln2 + r, |r| <= ln2/2, a
// degree-7 Taylor polynomial (truncation error under 1e-8 relative) and 2^n from the exponent
// bits; about 2 ulp in all. Written so the loops below vectorise without -ffast-math (libm's expf
// is a call per element, and a 100k-token row is exponentiated on every sampling step; the file is
// built with -fno-trapping-math so the clamp below may become a vector max). Inputs
// below -87 give about 1e-38 instead of a denormal: nothing next to a row maximum's exp(0) = 1.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p;
  ExpTaylor7(r, p);
  // A NaN x (a NaN logit, or inf - inf) stays NaN through the clamp; its n converted to int was
  // undefined (INT_MIN on x86, and INT_MIN + 127 times 2^23 overflowed). p is NaN then, so 2^0
  // keeps the result NaN, as it was.
  const int32_t bits = (static_cast<int32_t>(n == n ? n : 0.0f) + 127) * (1 << 23);
  return p * std::bit_cast<float>(bits);
}

// The row loops are built for AVX-512, AVX2 and baseline x86-64, picked at load time.
#define KIMI_ROW_LOOP __attribute__((target_clones("avx512f", "avx2", "default")))

// 16 floats / 8 doubles as one value (GCC vector types): GCC left the same loops over arrays of
// lanes scalar (vmaxss, vaddsd), which made MaxOf and ExpRow's sums most of a 100k-vocabulary
// row's sampling. Lane j still takes elements j, j + 16, ... in order, so the results are the same.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Floats16 __attribute__((vector_size(64)));
typedef double Doubles8 __attribute__((vector_size(64)));
typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints16 __attribute__((vector_size(64)));
typedef uint32_t Uints16 __attribute__((vector_size(64)));

// Lane j of the result = the largest of x[j], x[j + 16], ... (n a multiple of 16; -inf for none;
// NaNs are passed over).
inline __attribute__((always_inline)) Floats16 LaneMaxima(const float* x, size_t n) {
  Floats16 lanes;
  for (int j = 0; j < 16; ++j) lanes[j] = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; i += 16) {
    Floats16 v;
    std::memcpy(&v, x + i, sizeof v);
    lanes = v > lanes ? v : lanes;
  }
  return lanes;
}
inline __attribute__((always_inline)) float LargestLane(Floats16 lanes) {
  float l[16];
  std::memcpy(l, &lanes, sizeof l);
  return *std::max_element(std::begin(l), std::end(l));
}

KIMI_ROW_LOOP float MaxOf(std::span<const float> x) {
  const size_t whole = x.size() / 16 * 16;
  float m = LargestLane(LaneMaxima(x.data(), whole));
  for (size_t i = whole; i < x.size(); ++i) m = std::max(m, x[i]);
  return m;
}

// Lane j of the result = the larger of lane j of a and of b (neither is ever NaN here).
#define KIMI_LARGER(a, b) ((a) > (b) ? (a) : (b))

// Lane r of the result = the largest lane of v[r]: four rounds of pairing halves (16 vectors to 8
// holding two runs' 8 lanes each, to 4 of four runs' 4, to 2 of eight runs' 2, to 1), 15 maxima
// and 30 shuffles for 16 runs where LargestLane takes 15 scalar maxima a run.
inline __attribute__((always_inline)) void LargestLanes(const Floats16 (&v)[16], Floats16& out) {
  Floats16 halves[8], quarters[4], eighths[2];
  for (int k = 0; k < 8; ++k) {
    const Floats16 a = v[2 * k], b = v[2 * k + 1];
    halves[k] = KIMI_LARGER(
        __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
        __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                31));
  }
  for (int k = 0; k < 4; ++k) {
    const Floats16 a = halves[2 * k], b = halves[2 * k + 1];
    quarters[k] = KIMI_LARGER(
        __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
        __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31));
  }
  for (int k = 0; k < 2; ++k) {
    const Floats16 a = quarters[2 * k], b = quarters[2 * k + 1];
    eighths[k] = KIMI_LARGER(
        __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
        __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31));
  }
  const Floats16 a = eighths[0], b = eighths[1];
  out = KIMI_LARGER(
      __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
      __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
}
#undef KIMI_LARGER

// maxima[r] = the largest of x[r * kRun, (r + 1) * kRun) for every whole run of x, in one pass
// (MaxOf called run by run paid its dispatch and lane set-up for every 64 values: a third of a
// 100k-vocabulary row's sampling), 16 runs' lanes reduced at once (LargestLanes): one thread, the
// 64 rows of RowMaxima's comment in cache, 42-44 us a row against 47-49 with a run's lanes
// reduced one by one (the run maxima themselves 6% of the samples in perf, from 20%), the same
// tokens.
constexpr size_t kRun = 64;
KIMI_ROW_LOOP void RunMaxima(std::span<const float> x, float* maxima) {
  const size_t runs = x.size() / kRun;
  size_t r = 0;
  for (; r + 16 <= runs; r += 16) {
    Floats16 lanes[16];
    for (int j = 0; j < 16; ++j) lanes[j] = LaneMaxima(x.data() + (r + j) * kRun, kRun);
    Floats16 m;
    LargestLanes(lanes, m);
    std::memcpy(maxima + r, &m, sizeof m);
  }
  for (; r < runs; ++r) maxima[r] = LargestLane(LaneMaxima(x.data() + r * kRun, kRun));
}

// Signed integers that order non-NaN floats as < does (-0 just below +0), and back.
inline int32_t SignedKey(float x) {
  const auto bits = std::bit_cast<int32_t>(x);
  return bits < 0 ? bits ^ 0x7fffffff : bits;
}
inline float FromSignedKey(int32_t key) {
  return std::bit_cast<float>(key < 0 ? key ^ 0x7fffffff : key);
}

// The n-th largest of x (1 <= n <= x.size(), no NaNs): the largest key K with at least n keys at
// or above it, found by halving [smallest key, largest key], each count taken 16 lanes at a time
// without a branch (at most 32 rounds over the keys). TopIds' bound: over a 100,512-token row's
// 1570 run maxima at n = 40 a min-heap of the n largest took 17-18 thousand cycles (its pushes and
// pops follow the data, so their branches mispredict; std::nth_element was three times slower
// still), this 5 thousand.
KIMI_ROW_LOOP float NthLargest(std::span<const float> x, size_t n) {
  thread_local std::vector<int32_t> keys;
  const size_t padded = (x.size() + 15) / 16 * 16;
  keys.assign(padded, std::numeric_limits<int32_t>::min());  // padding: below every mid
  int64_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
  for (size_t i = 0; i < x.size(); ++i) {
    keys[i] = SignedKey(x[i]);
    lo = std::min<int64_t>(lo, keys[i]);
    hi = std::max<int64_t>(hi, keys[i]);
  }
  while (lo < hi) {  // at least n keys >= lo, fewer than n above hi
    const int64_t mid = lo + (hi - lo + 1) / 2;
    Ints16 at_least = {}, m;
    for (int j = 0; j < 16; ++j) m[j] = static_cast<int32_t>(mid);
    for (size_t i = 0; i < padded; i += 16) {
      Ints16 k;
      std::memcpy(&k, keys.data() + i, sizeof k);
      at_least -= k >= m;  // a true lane is -1
    }
    int64_t count = 0;
    for (int j = 0; j < 16; ++j) count += at_least[j];
    if (count >= static_cast<int64_t>(n)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return FromSignedKey(static_cast<int32_t>(lo));
}

// Blocks of a row whose exp sums are kept, so a draw finds its block and walks only that one.
constexpr size_t kBlock = 1024;

// x = ExpNonPositive(x) on 16 lanes: the same steps, but 2^n taken from the bits of the rounding
// sum t (t = 1.5 * 2^23 + n exactly), which needs no float-to-int conversion and no NaN case (a NaN
// lane's p is NaN, and NaN times any scale stays NaN).
inline __attribute__((always_inline)) void ExpNonPositive16(Floats16& x) {
  const Floats16 floor = Floats16{} - 87.0f;
  x = x < floor ? floor : x;  // a NaN lane stays NaN
  const Floats16 t = x * 1.44269504088896341f + 12582912.0f;
  const Floats16 n = t - 12582912.0f;
  const Floats16 r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  Floats16 p;
  ExpTaylor7(r, p);
  Uints16 bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4b400000u + 127u) << 23;
  Floats16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  x = p * scale;
}

// The logits row the thread samples after the current one, if any (SampleToken's `next`): the
// first pass of exps over the current row (ExpRow) prefetches it, line for line, and clears this.
struct NextRow {
  const float* data = nullptr;
  size_t size = 0;
};

// Adds the 16 lanes of v, widened to double, to two accumulators of 8.
inline __attribute__((always_inline)) void AddWidened(const Floats16& v, Doubles8& lo,
                                                      Doubles8& hi) {
  Floats8 half[2];
  std::memcpy(half, &v, sizeof half);
  lo += __builtin_convertvector(half[0], Doubles8);
  hi += __builtin_convertvector(half[1], Doubles8);
}

// w[i] = exp((x[i] - top) * scale) (top >= every x[i]; w may be null when only the sum is
// wanted); returns the sum by blocks (block_sums, when given, receives each block's sum). One pass,
// 128 values a step into double accumulators. With w, every value is widened and added in double:
// the draws walk w adding in double, and their totals and block sums must agree with that walk.
// Without w (the logprobs' normaliser) the 128 exps are first added in float as a tree of eight
// vectors (three roundings deep: relative error under 2e-7, about the exps' own) and each lane's
// sum widened. Exps into a buffer, then every value widened and added on one double accumulator
// (an add's latency per 8 values, and GCC widens 8 floats in three instructions) took 72-75 us a
// row where this takes 61 (the probe of RowMaxima's comment).
//
// With `next`, each step also prefetches (into L2) the same 128 values' lines of the next row and
// `next` is cleared: that row's first pass (RowMaxima) then finds it in cache. In the engine loop
// the rows were just written by the LM head and have left the caches (25.7 MB at batch 64), and one
// thread's first pass over a row read it at about 12 GB/s while nothing else ran; these exps are
// compute-bound, so the next row's read fits beside them. Prefetched during the row's first pass
// instead (where the row's own read already waits on memory), or all at once when the row starts,
// it did not help (see SampleToken).
KIMI_ROW_LOOP double ExpRow(std::span<const float> x, float top, float scale, float* w,
                            std::vector<double>* block_sums, NextRow* next = nullptr) {
  const float* ahead = next ? next->data : nullptr;
  const size_t ahead_size = ahead ? next->size : 0;
  if (next) *next = NextRow{};
  double total = 0.0;
  for (size_t b = 0; b < x.size(); b += kBlock) {
    const size_t e = std::min(x.size(), b + kBlock);
    Doubles8 acc[2] = {};
    size_t i = b;
    for (; i + 128 <= e; i += 128) {
      if (i + 128 <= ahead_size) {
        for (int h = 0; h < 8; ++h) __builtin_prefetch(ahead + i + 16 * h, 0, 2);
      }
      Floats16 v[8];
      for (int h = 0; h < 8; ++h) {
        std::memcpy(&v[h], x.data() + i + 16 * h, sizeof v[h]);
        v[h] = (v[h] - top) * scale;
        ExpNonPositive16(v[h]);
        if (w) std::memcpy(w + i + 16 * h, &v[h], sizeof v[h]);
      }
      if (w) {
        for (int h = 0; h < 8; ++h) AddWidened(v[h], acc[0], acc[1]);
      } else {
        AddWidened(((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])), acc[0],
                   acc[1]);
      }
    }
    const Doubles8 all = acc[0] + acc[1];
    double lanes[8];
    std::memcpy(lanes, &all, sizeof lanes);
    double sum = 0.0;
    for (double v : lanes) sum += v;
    for (; i < e; i += 16) {  // the last values of the row, up to 16 at a time
      const size_t n = std::min<size_t>(16, e - i);
      float in[16], out[16];
      std::fill_n(in, 16, top);  // lanes past the row: exp(0), never used
      std::copy_n(x.data() + i, n, in);
      Floats16 v;
      std::memcpy(&v, in, sizeof v);
      v = (v - top) * scale;
      ExpNonPositive16(v);
      std::memcpy(out, &v, sizeof out);
      for (size_t j = 0; j < n; ++j) sum += out[j];
      if (w) std::copy_n(out, n, w + i);
    }
    if (block_sums) block_sums->push_back(sum);
    total += sum;
  }
  return total;
}
#pragma GCC diagnostic pop

// A per-thread row of scratch (rows are sampled in parallel, one per thread at a time).
float* Scratch(size_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// log of the raw row's softmax normaliser: logprob(t) = x[t] - LogSumExp(x); mx = MaxOf(x). On
// AVX-512 the exps take vscalefps and vreduceps (exp_sum_avx512.h): the 64 rows of RowMaxima's
// comment at top-k 40, top-p 0.95 with the chosen token's logprob, written by two threads just
// before (in L3, as the LM head leaves them) and sampled on two, 32 rows each: 41-46 -> 33-39 us a
// row a thread; the same tokens, the logprobs within a float ulp or so of the portable loop's (see
// exp_sum_avx512.h).
double LogSumExp(std::span<const float> x, float mx, NextRow* next) {
  if (cpu::HasAvx512(cpu::MatMulIsa())) {
    const NextRow ahead = next ? *next : NextRow{};
    if (next) *next = NextRow{};
    return mx + std::log(ExpSumAvx512(x.data(), x.size(), mx, ahead.data, ahead.size));
  }
  return mx + std::log(ExpRow(x, mx, 1.0f, nullptr, nullptr, next));
}

// A row's run maxima (RunMaxima: TopIds' bound) and its largest value, from one pass over the
// row taken when first asked for: that pass reads the row from memory, the later ones (candidates,
// exps) find it in L2. The largest value in a pass of its own (MaxOf) before the draw cost as much
// again: one thread, 64 rows of a k3-mini batch-64 step's logits (100,512 each, written out by
// kimi-bench's scheduler.overhead.b64) at top-k 40, top-p 0.95 with the chosen token's logprob,
// 68-70 us a row with that pass, 61 without, the same tokens.
class RowMaxima {
 public:
  explicit RowMaxima(std::span<const float> x) : x_(x) {}
  // The maxima of the row's whole runs of kRun values.
  std::span<const float> Runs() {
    Scan();
    return runs_;
  }
  // The largest value (NaNs passed over; -inf for none), as MaxOf(x).
  float Top() {
    Scan();
    return top_;
  }
  // LogSumExp(x, Top()), taken in the same pass as the maxima where the row is not scanned yet
  // (AVX-512, RunMaximaExpSumAvx512); nullopt elsewhere.
  std::optional<double> ScanWithLogSumExp() {
    if (scanned_ || !cpu::HasAvx512(cpu::MatMulIsa())) return std::nullopt;
    scanned_ = true;
    runs_.resize(x_.size() / kRun);
    const double sum = RunMaximaExpSumAvx512(x_.data(), x_.size(), runs_.data(), &top_);
    return top_ + std::log(sum);
  }

 private:
  void Scan() {
    if (scanned_) return;
    scanned_ = true;
    const size_t whole = x_.size() / kRun;
    runs_.resize(whole);
    RunMaxima(x_.first(whole * kRun), runs_.data());
    top_ = MaxOf(runs_);
    for (size_t i = whole * kRun; i < x_.size(); ++i) top_ = std::max(top_, x_[i]);
  }

  std::span<const float> x_;
  bool scanned_ = false;
  std::vector<float> runs_;
  float top_ = 0.0f;
};

// The best n ids of a row, best first: larger value, ties to the lower id (NaNs never qualify while
// there are n others). The n-th largest run maximum bounds the n-th best value from below (the n
// largest maxima are n distinct elements), so only the elements at or above it are candidates: a
// few runs' worth, ordered once. A heap offered every element above its current worst (some three
// hundred pops and pushes at n = 40) was slower: one thread, 64 rows of 100,512 normal logits at
// top-k 40, top-p 0.95, with the chosen token's logprob, 73-83 -> 59-69 us per row (47 -> 34
// without the logprob), the same tokens. The n-th largest maximum itself: see NthLargest.
std::vector<int32_t> TopIds(std::span<const float> l, size_t n, RowMaxima& row) {
  n = std::min(n, l.size());
  std::vector<int32_t> ids;
  if (n == 0) return ids;
  auto better = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  const size_t runs = l.size() / kRun;
  if (runs >= n) {
    const std::span<const float> maxima = row.Runs();
    const float bound = NthLargest(maxima, n);
    for (size_t r = 0; r < runs; ++r) {
      if (!(maxima[r] >= bound)) continue;
      for (size_t j = r * kRun; j < (r + 1) * kRun; ++j) {
        if (l[j] >= bound) ids.push_back(static_cast<int32_t>(j));
      }
    }
    for (size_t j = runs * kRun; j < l.size(); ++j) {
      if (l[j] >= bound) ids.push_back(static_cast<int32_t>(j));
    }
  }
  if (ids.size() < n) {  // a short row, or one of NaNs and -inf: order all of it
    ids.clear();
    for (size_t j = 0; j < l.size(); ++j) {
      if (!std::isnan(l[j])) ids.push_back(static_cast<int32_t>(j));
    }
    const size_t numbers = ids.size();  // NaNs, if needed, go after every number, by id
    for (size_t j = 0; j < l.size() && ids.size() < n; ++j) {
      if (std::isnan(l[j])) ids.push_back(static_cast<int32_t>(j));
    }
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(numbers, n)),
                      ids.begin() + static_cast<std::ptrdiff_t>(numbers), better);
    ids.resize(n);
    return ids;
  }
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), better);
  ids.resize(n);
  return ids;
}

// A logit's bits as an unsigned key that orders like TopIds: larger logits first (smaller keys),
// -0 tied with +0, NaN after every number.
inline uint32_t OrderKey(float x) {
  if (std::isnan(x)) return 0xffffffffu;
  const auto bits = std::bit_cast<uint32_t>(x == 0.0f ? 0.0f : x);
  return ~((bits & 0x80000000u) ? ~bits : (bits | 0x80000000u));
}

// Prefixes of a row in TopIds' order, found by mass without ordering the row: top-p and min-p
// where the candidates are more than the best 1024 tokens (a flat distribution), for every token
// drawn. A prefix is named by its last element; element i is in it when (key, id) is at or before
// that element's. Reach selects by radix: mass per bucket of the keys' top 11 bits, then of the
// next 11 and the last 10 within the bucket where the mass is reached, then the ties in id order.
// One thread, a 100,512-token row of normal(0, 0.3) logits at temperature 0.8 and top-p 0.95:
// 4.1 ms a draw ordering the whole row (a stable radix sort of key-id pairs, then each
// probability in order), 0.93 ms now, the same tokens in 300 draws (top-p 0.5 2.2 -> 1.1, min-p
// 0.3 1.65 -> 0.94; no filter 0.26).
class MassOrder {
 public:
  struct Cut {
    uint32_t key;
    int32_t id;
    double mass;  // of the prefix, in w's units
  };
  MassOrder(std::span<const uint32_t> keys, const float* w) : keys_(keys), w_(w) {}

  Cut Whole(double total) const {
    return {0xffffffffu, static_cast<int32_t>(keys_.size()) - 1, total};
  }

  // The shortest prefix inside `within` whose mass reaches x (>= x, or > x when strict), with its
  // mass; `within` when none does.
  Cut Reach(double x, bool strict, Cut within) const {
    auto reached = [&](double acc) { return strict ? acc > x : acc >= x; };
    auto inside = [&](size_t i) {
      return keys_[i] < within.key ||
             (keys_[i] == within.key && static_cast<int32_t>(i) <= within.id);
    };
    // Level 0 over the whole row; what falls into the chosen bucket is gathered for the rest.
    double before = 0.0;
    double mass[kBuckets];
    bool seen[kBuckets];
    int chosen = Pick(
        [&](auto add) {
          for (size_t i = 0; i < keys_.size(); ++i) {
            if (inside(i)) add(keys_[i] >> 21, w_[i]);
          }
        },
        reached, mass, seen, &before);
    if (chosen < 0) return {within.key, within.id, before};
    thread_local std::vector<int32_t> candidates;
    candidates.clear();
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] >> 21 == static_cast<uint32_t>(chosen) && inside(i)) {
        candidates.push_back(static_cast<int32_t>(i));
      }
    }
    uint32_t prefix = static_cast<uint32_t>(chosen) << 21, mask = 0xffe00000u;
    for (const int shift : {10, 0}) {
      const uint32_t width = shift ? 0x7ffu : 0x3ffu;
      double level_before = before;
      chosen = Pick(
          [&](auto add) {
            for (int32_t i : candidates) {
              if ((keys_[i] & mask) == prefix) add((keys_[i] >> shift) & width, w_[i]);
            }
          },
          reached, mass, seen, &level_before);
      if (chosen < 0) {  // reached above only by rounding: the last bucket holds the boundary
        for (int b = static_cast<int>(width); b >= 0; --b) {
          if (seen[b]) {
            chosen = b;
            break;
          }
        }
        level_before = before;
        for (int b = 0; b < chosen; ++b) level_before += seen[b] ? mass[b] : 0.0;
      }
      before = level_before;
      prefix |= static_cast<uint32_t>(chosen) << shift;
      mask |= width << shift;
    }
    Cut last{prefix, -1, before};
    for (int32_t i : candidates) {  // ties, in id order
      if (keys_[i] != prefix) continue;
      last.id = i;
      last.mass += w_[i];
      if (reached(last.mass)) return last;
    }
    return last;
  }

 private:
  static constexpr size_t kBuckets = 2048;

  // Sums w by bucket (visit calls add(bucket, w) for each element of the level) and returns the
  // first bucket, in key order, whose mass brings *before up to the goal (*before then holds the
  // mass ahead of it), or -1 when none does (*before then holds all of it).
  template <typename Visit, typename Reached>
  static int Pick(Visit visit, Reached reached, double* mass, bool* seen, double* before) {
    std::fill(mass, mass + kBuckets, 0.0);
    std::fill(seen, seen + kBuckets, false);
    visit([&](uint32_t b, float w) {
      mass[b] += w;
      seen[b] = true;
    });
    for (size_t b = 0; b < kBuckets; ++b) {
      if (!seen[b]) continue;
      if (reached(*before + mass[b])) return static_cast<int>(b);
      *before += mass[b];
    }
    return -1;
  }

  std::span<const uint32_t> keys_;
  const float* w_;
};

void ApplyPenalties(std::vector<float>& l, const SamplingParams& p,
                    std::span<const int32_t> prompt, std::span<const int32_t> output) {
  if (p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f) {
    // Each id seen once, found from the history rather than by a pass over the whole row.
    std::vector<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(seen.end(), output.begin(), output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : output) ++counts[t];
    for (const auto& [t, n] : counts) {
      l[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(n);
    }
  }
}

// The first id of the row's largest value, NaNs passed over (0 for a row of NaNs), in one pass:
// each lane keeps its largest value and where it was (a strict > keeps a lane's first), then the
// lanes' best is the largest, the lowest id among equals. std::max_element stayed scalar: 82 us a
// 100k row, more than a whole draw at temperature 0.8 and 13% of a saturated k3-tiny server.
KIMI_ROW_LOOP int32_t ArgMax(std::span<const float> l) {
  const size_t whole = l.size() / 16 * 16;
  Floats16 best;
  Ints16 at, id;
  for (int j = 0; j < 16; ++j) {
    best[j] = -std::numeric_limits<float>::infinity();
    at[j] = -1;
    id[j] = j;
  }
  for (size_t i = 0; i < whole; i += 16) {
    Floats16 v;
    std::memcpy(&v, l.data() + i, sizeof v);
    const Ints16 better = v > best;
    best = better ? v : best;
    at = better ? id : at;
    id += 16;
  }
  float top = -std::numeric_limits<float>::infinity();
  int32_t arg = -1;
  for (int j = 0; j < 16; ++j) {  // -1: the lane saw only -inf and NaN
    if (at[j] >= 0 && (best[j] > top || (best[j] == top && at[j] < arg))) {
      top = best[j];
      arg = at[j];
    }
  }
  for (size_t i = whole; i < l.size(); ++i) {
    if (l[i] > top) {
      top = l[i];
      arg = static_cast<int32_t>(i);
    }
  }
  if (arg >= 0) return arg;
  // Nothing above -inf: the first -inf, else (all NaN) 0.
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i] == top) return static_cast<int32_t>(i);
  }
  return 0;
}

// Probability of each token under temperature, top-k, min-p and top-p, then the token whose
// cumulative mass first exceeds u. Candidates are ordered by scaled logit (ties: lower id first);
// with no filters the draw walks ids in order, which needs no sort. top = MaxOf(l).
// Top-p and min-p (without top-k) over a row whose candidates go past the best 1024 tokens: the
// prefixes of MassOrder, the same tokens as ordering the whole row.
// w[i] = exp((l[i] - top) / temperature), total their sum.
int32_t DrawWholeRow(std::span<const float> l, const SamplingParams& p, double u, const float* w,
                     double total) {
  const size_t V = l.size();
  thread_local std::vector<uint32_t> keys;
  keys.resize(V);
  for (size_t i = 0; i < V; ++i) keys[i] = OrderKey(l[i]);
  const MassOrder order(keys, w);
  MassOrder::Cut n = order.Whole(total);
  if (p.top_p < 1.0f) n = order.Reach(p.top_p * total, /*strict=*/false, n);
  if (p.min_p > 0.0f) {  // the tokens at or above min_p times the best: a prefix, ended by its last
    const double floor = p.min_p * (double{ExpNonPositive(0.0f)} / total);
    MassOrder::Cut kept{0, -1, 0.0};
    for (size_t i = 0; i < V; ++i) {
      if (!(w[i] / total >= floor)) continue;
      kept.mass += w[i];
      if (keys[i] > kept.key || (keys[i] == kept.key && static_cast<int32_t>(i) > kept.id)) {
        kept.key = keys[i];
        kept.id = static_cast<int32_t>(i);
      }
    }
    if (kept.id >= 0 && (kept.key < n.key || (kept.key == n.key && kept.id < n.id))) n = kept;
  }
  return order.Reach(u * n.mass, /*strict=*/true, n).id;
}

// Probability of each token under temperature, top-k, min-p and top-p, then the token whose
// cumulative mass first exceeds u. Candidates are ordered by scaled logit (ties: lower id first);
// with no filters the draw walks ids in order, which needs no sort. row: l's maxima; next: see
// ExpRow.
int32_t Draw(std::span<const float> l, const SamplingParams& p, double u, RowMaxima& row,
             NextRow* next) {
  const float top = row.Top();
  const size_t V = l.size();
  const float inv_t = 1.0f / p.temperature;
  const bool filtered =
      (p.top_k > 0 && static_cast<size_t>(p.top_k) < V) || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!filtered) {
    float* w = Scratch(V);
    std::vector<double> blocks;
    const double target = u * ExpRow(l, top, inv_t, w, &blocks, next);
    double acc = 0.0;
    size_t b = 0;
    while (b + 1 < blocks.size() && !(target < acc + blocks[b])) acc += blocks[b++];
    for (size_t i = b * kBlock; i < V; ++i) {
      acc += w[i];
      if (target < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(V - 1);
  }
  const size_t keep = p.top_k > 0 ? std::min<size_t>(V, static_cast<size_t>(p.top_k)) : V;
  // The normaliser covers every kept token; ordering is needed only as far as the filters look.
  // Take the best 1024 first; without top-k, top-p or min-p may look past them (a flat
  // distribution), and then the row is drawn from by mass instead.
  const std::vector<int32_t> order = TopIds(l, keep == V ? std::min(V, size_t{1024}) : keep, row);
  double total = 0.0;
  float* w = nullptr;  // every weight, kept for the whole row's draw
  if (keep == V) {
    w = Scratch(V);
    total = ExpRow(l, top, inv_t, w, nullptr, next);
  } else {
    for (size_t i = 0; i < keep; ++i) total += ExpNonPositive((l[order[i]] - top) * inv_t);
  }
  std::vector<double> probs;  // of the candidates in order, each computed once
  auto prob = [&](size_t i) {
    assert(i < order.size());
    while (probs.size() <= i) {
      probs.push_back(ExpNonPositive((l[order[probs.size()]] - top) * inv_t) / total);
    }
    return probs[i];
  };
  // A filter that would look past the candidates in order (fewer than `keep` only without
  // top-k) draws from the whole row by mass.
  const size_t known = order.size();
  size_t n = keep;
  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double mass = 0.0;
    size_t m = 0;
    while (m < keep) {
      if (m == known) return DrawWholeRow(l, p, u, w, total);
      mass += prob(m++);
      if (mass >= p.top_p) break;
    }
    n = m;
  }
  if (p.min_p > 0.0f) {  // drop tokens below min_p times the best probability
    const double floor = p.min_p * prob(0);
    size_t m = 1;
    while (m < n) {
      if (m == known) return DrawWholeRow(l, p, u, w, total);
      if (!(prob(m) >= floor)) break;
      ++m;
    }
    n = m;
  }
  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) mass += prob(i);
  const double target = u * mass;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob(i);
    if (target < acc) return order[i];
  }
  return order[n - 1];
}

}  // namespace

double UniformAt(uint64_t seed, uint64_t index) {
  const uint64_t h = Mix(Mix(seed ^ 0x9e3779b97f4a7c15ull) + index * 0xd1b54a32d192ed03ull);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

TokenChoice SampleToken(std::span<const float> logits, const SamplingParams& p,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        uint64_t index, std::span<const float> next) {
  TokenChoice choice;
  // The next row rides on this row's first ExpRow (the draw's, without top-k, else the
  // logprobs'); a row sampled with neither takes no prefetch. One thread, 64 rows of a batch-64
  // k3-mini step's logits (top-k 40, top-p 0.95, the chosen token's logprob) read from memory (a
  // 640 MB read before each round; two threads, 32 rows each, as the engine loop samples them):
  // 36-38 us a row against 42-46 without (the same rows in cache: 27). Prefetching the next row
  // during this row's first pass instead: 40-43; all of it when the row starts: 46-50. On AVX-512
  // a row with logprobs and no penalty takes its normaliser in its first pass instead (below),
  // which prefetches its own row, not the next.
  NextRow ahead{next.data(), next.size()};
  const bool penalised = (p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f) ||
                         p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  std::vector<float> adjusted;
  std::span<const float> l = logits;
  if (penalised) {
    adjusted.assign(logits.begin(), logits.end());
    ApplyPenalties(adjusted, p, prompt, output);
    l = adjusted;
  }
  RowMaxima row(l);
  const bool logprobs = p.want_logprobs || p.logprobs > 0;
  // The logprobs' normaliser in the maxima's pass, its exps computed while the row comes from
  // memory, where a pass of its own (LogSumExp) read the row again: in the engine loop a row with
  // the chosen token's logprob took 16-19 us to draw (maxima, candidates) and 22-31 more for the
  // normaliser (kimi-bench's scheduler.overhead.b64 sampled alone; exp_sum_avx512.cc has the
  // step-time figures).
  const std::optional<double> fused_lse =
      logprobs && !penalised ? row.ScanWithLogSumExp() : std::nullopt;
  // A temperature so small that 1 / temperature overflows (under about 3e-39) is greedy: every
  // other token's weight is 0 there anyway, and the draw's (x - top) / t would be inf * 0 = NaN.
  if (p.temperature <= 0.0f || !std::isfinite(1.0f / p.temperature)) {
    choice.token = ArgMax(l);
  } else {
    choice.token = Draw(l, p, UniformAt(p.seed, index), row, &ahead);
  }
  if (logprobs) {
    // The normaliser and alternatives are the raw row's: l's maxima unless penalties changed l.
    std::optional<RowMaxima> raw;
    RowMaxima& r = penalised ? raw.emplace(logits) : row;
    const double lse = fused_lse ? *fused_lse : LogSumExp(logits, r.Top(), &ahead);
    choice.logprob = static_cast<float>(logits[choice.token] - lse);
    for (int32_t id : TopIds(logits, static_cast<size_t>(std::max(0, p.logprobs)), r)) {
      choice.top.emplace_back(id, static_cast<float>(logits[id] - lse));
    }
  }
  return choice;
}

}  // namespace kimi::sched
