#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_budget.h"

namespace kimi::cpu {
namespace {

thread_local bool tls_in_worker = false;
thread_local int tls_index = 0;
thread_local uint32_t tls_context = 0;

int DefaultThreads() {
  if (const char* env = std::getenv("KIMI_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return ProcessCpuBudget().usable();  // not hardware_concurrency(): see cpu_budget.h
}

std::chrono::microseconds SpinBudget() {
  if (const char* env = std::getenv("KIMI_SPIN_US")) {
    const int us = std::atoi(env);
    if (us >= 0) return std::chrono::microseconds(us);
  }
  return std::chrono::microseconds(300);
}

// Waits longer than this stop being pure spins and start yielding the core.
constexpr std::chrono::microseconds kPureSpin(20);

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Prefetches the 8 cache lines (512 bytes) at `at` towards L2 and advances it: a few tens of
// nanoseconds between two looks at the job word. Any address will do: a prefetch never faults.
inline void PrefetchLines(uintptr_t& at) {
  constexpr int kLines = 8;
  for (int l = 0; l < kLines; ++l) {
    __builtin_prefetch(reinterpret_cast<const char*>(at + 64 * l), /*rw=*/0, /*locality=*/2);
  }
  at += 64 * kLines;
}

}  // namespace

// One job at a time, published in one cache line: `seq` (odd while the caller writes the fields,
// then the job's even id) and the fields, stored as relaxed atomics so a worker that reads them
// while the next job is being written races on nothing. Workers spin on `seq`; when it turns to a
// new even id they read the fields, check `seq` again (a sequence lock), and take parts through
// `ticket`, which holds the job id beside the next part: a claim is a compare-and-swap that fails
// once the job has been replaced, so a worker that read an old job runs none of it. The caller
// takes parts the same way and returns once `done` counts every part; a part is only claimed
// while its job is current, so nothing of a finished job runs late.
//
// Parts are fixed index ranges, so results never depend on which thread ran which part; taking
// them dynamically means a worker the machine has descheduled (a busy, shared host) delays nobody:
// the caller runs its parts instead. A job moves three cache lines between the threads (the job,
// the ticket, then `done`); the earlier design, with a join counter and the fields on lines of
// their own, moved about six, and a 2-part job's hand-off cost 15-20% more on a 2-vCPU guest.
struct ThreadPool::Shared {
  alignas(64) std::atomic<uint32_t> seq{0};
  std::atomic<const std::function<void(int64_t, int64_t)>*> fn{nullptr};
  std::atomic<int64_t> n{0};
  std::atomic<int64_t> parts{0};
  std::atomic<int64_t> chunk{0};     // items per part when > 0; else n split evenly into `parts`
  std::atomic<uint32_t> context{0};  // the caller's Context(), handed to the workers
  std::atomic<int> participants{0};  // threads (caller included) that may take parts
  std::atomic<bool> stop{false};
  alignas(64) std::atomic<uint64_t> ticket{0};  // job id << 32 | next part
  alignas(64) std::atomic<int64_t> done{0};
  alignas(64) std::atomic<int> sleepers{0};
  // Idle hints (SetIdleHints): a generation, bumped after the ranges change, and one range per
  // thread index. A worker reading a range while it is rewritten may prefetch a mix of two hints:
  // harmless, a prefetch never faults.
  static constexpr int kMaxHints = 64;
  alignas(64) std::atomic<uint64_t> hint_generation{0};
  std::atomic<uintptr_t> hint_begin[kMaxHints] = {};
  std::atomic<int64_t> hint_bytes[kMaxHints] = {};
  uintptr_t caller_hint = 0, caller_hint_end = 0;  // entry 0, the caller's: its own thread only
  std::chrono::microseconds spin{0};
  std::vector<std::thread> threads;
};

namespace {

// Range of part i.
inline void PartRange(int64_t n, int64_t parts, int64_t chunk, int64_t i, int64_t* begin,
                      int64_t* end) {
  if (chunk > 0) {
    *begin = i * chunk;
    *end = std::min(n, *begin + chunk);
  } else {
    *begin = n * i / parts;
    *end = n * (i + 1) / parts;
  }
}

// Claims and runs parts of job `id` until none are left or the job is no longer current.
void RunParts(std::atomic<uint64_t>& ticket, std::atomic<int64_t>& done, uint32_t id,
              const std::function<void(int64_t, int64_t)>& fn, int64_t n, int64_t parts,
              int64_t chunk) {
  uint64_t t = ticket.load(std::memory_order_relaxed);
  for (;;) {
    if (static_cast<uint32_t>(t >> 32) != id) return;
    const int64_t i = static_cast<int64_t>(t & 0xffffffffu);
    if (i >= parts) return;
    if (!ticket.compare_exchange_weak(t, t + 1, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      continue;  // t now holds the current ticket
    }
    int64_t begin, end;
    PartRange(n, parts, chunk, i, &begin, &end);
    if (begin < end) fn(begin, end);
    done.fetch_add(1, std::memory_order_release);
    t = ticket.load(std::memory_order_relaxed);
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : DefaultThreads()),
      active_(num_threads_),
      shared_(new Shared) {
  shared_->spin = SpinBudget();
  for (int i = 1; i < num_threads_; ++i) {
    shared_->threads.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  shared_->stop.store(true, std::memory_order_relaxed);
  shared_->seq.fetch_add(2, std::memory_order_seq_cst);
  shared_->seq.notify_all();
  for (auto& t : shared_->threads) t.join();
  delete shared_;
}

ThreadPool& ThreadPool::Global() {
  static ThreadPool* pool = new ThreadPool();  // never destroyed: workers may outlive statics
  return *pool;
}

bool ThreadPool::InParallelSection() { return tls_in_worker; }

int ThreadPool::ThreadIndex() { return tls_index; }

void ThreadPool::SetIdleHints(const MemoryRange* by_thread, int count) {
  Shared& s = *shared_;
  for (int i = 1; i < std::min(count, Shared::kMaxHints); ++i) {
    s.hint_begin[i].store(reinterpret_cast<uintptr_t>(by_thread[i].begin),
                          std::memory_order_relaxed);
    s.hint_bytes[i].store(by_thread[i].bytes, std::memory_order_relaxed);
  }
  for (int i = std::max(count, 1); i < std::min(num_threads_, Shared::kMaxHints); ++i) {
    s.hint_bytes[i].store(0, std::memory_order_relaxed);
  }
  s.caller_hint = s.caller_hint_end = 0;
  if (count > 0) {
    s.caller_hint = reinterpret_cast<uintptr_t>(by_thread[0].begin);
    s.caller_hint_end = s.caller_hint + std::max<int64_t>(0, by_thread[0].bytes);
  }
  s.hint_generation.fetch_add(1, std::memory_order_release);
}

uint32_t ThreadPool::Context() { return tls_context; }
void ThreadPool::SetContext(uint32_t context) { tls_context = context; }

void ThreadPool::SetActiveThreads(int n) {
  active_ = n <= 0 ? num_threads_ : std::min(n, num_threads_);
}

void ThreadPool::WorkerLoop(int index) {
  tls_in_worker = true;
  tls_index = index;
  Shared& s = *shared_;
  uint32_t seen = 0;  // the last job id this worker looked at
  uint64_t hints_seen = 0;
  uintptr_t hint = 0, hint_end = 0;  // the part of this worker's hint not yet prefetched
  for (;;) {
    // Spin while jobs come back to back, yield the core after a few microseconds (so a caller
    // sharing it with us can run), and sleep once the pool has been idle for the spin budget.
    // While there is a hint, the spin prefetches it instead, a few lines between checks.
    uint32_t id = s.seq.load(std::memory_order_acquire);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; id == seen || id % 2 != 0; ++i) {
      if (const uint64_t g = s.hint_generation.load(std::memory_order_acquire); g != hints_seen) {
        hints_seen = g;
        hint = hint_end = 0;
        if (index < Shared::kMaxHints) {
          hint = s.hint_begin[index].load(std::memory_order_relaxed);
          hint_end =
              hint + std::max<int64_t>(0, s.hint_bytes[index].load(std::memory_order_relaxed));
        }
      }
      if (hint < hint_end) {
        PrefetchLines(hint);
        id = s.seq.load(std::memory_order_acquire);
        continue;
      }
      CpuRelax();
      if (i % 64 == 0) {
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited > s.spin) {
          s.sleepers.fetch_add(1, std::memory_order_seq_cst);
          s.seq.wait(id, std::memory_order_seq_cst);
          s.sleepers.fetch_sub(1, std::memory_order_relaxed);
        } else if (waited > kPureSpin) {
          std::this_thread::yield();
        }
      }
      id = s.seq.load(std::memory_order_acquire);
    }
    seen = id;
    if (s.stop.load(std::memory_order_relaxed)) return;
    // Read the job, then check it was not rewritten meanwhile (see Shared).
    const auto* fn = s.fn.load(std::memory_order_relaxed);
    const int64_t n = s.n.load(std::memory_order_relaxed);
    const int64_t parts = s.parts.load(std::memory_order_relaxed);
    const int64_t chunk = s.chunk.load(std::memory_order_relaxed);
    const uint32_t context = s.context.load(std::memory_order_relaxed);
    const int participants = s.participants.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != id || index >= participants) continue;
    tls_context = context;
    RunParts(s.ticket, s.done, id, *fn, n, parts, chunk);
  }
}

void ThreadPool::Run(int64_t n, int64_t parts, int64_t chunk,
                     const std::function<void(int64_t, int64_t)>& fn) {
  Shared& s = *shared_;
  // Sequence-lock write: odd while the fields change, then the new job's even id. The previous
  // job is complete (every part done), so no worker is inside it; a late one fails its claim.
  const uint32_t id = s.seq.load(std::memory_order_relaxed) + 2;
  s.seq.store(id - 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.fn.store(&fn, std::memory_order_relaxed);
  s.n.store(n, std::memory_order_relaxed);
  s.parts.store(parts, std::memory_order_relaxed);
  s.chunk.store(chunk, std::memory_order_relaxed);
  s.context.store(tls_context, std::memory_order_relaxed);
  s.participants.store(static_cast<int>(std::min<int64_t>(active_, parts)),
                       std::memory_order_relaxed);
  s.done.store(0, std::memory_order_relaxed);
  s.ticket.store(static_cast<uint64_t>(id) << 32, std::memory_order_relaxed);
  s.seq.store(id, std::memory_order_seq_cst);  // publishes all of the above
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) s.seq.notify_all();
  tls_in_worker = true;
  RunParts(s.ticket, s.done, id, fn, n, parts, chunk);
  tls_in_worker = false;
  // Wait for parts other threads took, prefetching the caller's idle hint first (SetIdleHints).
  WaitUntil([&] { return s.done.load(std::memory_order_acquire) == parts; },
            [&] {
              if (s.caller_hint >= s.caller_hint_end) return false;
              PrefetchLines(s.caller_hint);
              return true;
            });
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t parts = std::min<int64_t>(active_, (n + grain - 1) / grain);
  if (parts <= 1 || tls_in_worker) {
    fn(0, n);
    return;
  }
  Run(n, parts, /*chunk=*/0, fn);
}

void ThreadPool::ParallelForChunks(int64_t n, int64_t chunk,
                                   const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // At least one item per part, and few enough parts for the ticket's 32-bit part index.
  constexpr int64_t kMaxParts = int64_t{1} << 31;
  chunk = std::max<int64_t>({chunk, 1, (n + kMaxParts - 1) / kMaxParts});
  const int64_t parts = (n + chunk - 1) / chunk;
  if (parts <= 1 || active_ <= 1 || tls_in_worker) {
    fn(0, n);
    return;
  }
  Run(n, parts, chunk, fn);
}

void WaitUntil(const std::function<bool()>& done, const std::function<bool()>& idle_work) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; !done(); ++i) {
    if (idle_work && idle_work()) continue;
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kPureSpin) {
      std::this_thread::yield();
    }
  }
}

int ShareCount(const ThreadPool& pool) { return std::min(pool.num_threads(), kMaxShares); }

int64_t ShareBegin(int64_t units, int64_t t, int64_t shares, int64_t tile) {
  return t == shares ? units : units * t / shares / tile * tile;
}

// Thread t starts on its own contiguous share of the units and takes its ranges (halving in
// length, whole tiles, at least the grain) from the front, so its weights stream on from one range
// into the next (the software prefetch runs ahead across the boundary); a thread that is done
// takes the others' last, shortest ranges from the back. With ranges handed out in turn from one
// list, as MatMulMany does for more rows, every range started a stream cold on a thread that had
// not read the range before it: on 2 threads, 0.25-1 MB products (a decode step's projections) read
// 0.49-0.63 of the streaming read, and one contiguous half per thread 1.08-1.19x that.
void RunInShares(ThreadPool& pool, int64_t units, int64_t grain, int64_t tile,
                 const std::function<void(int64_t, int64_t)>& run_units) {
  constexpr int kMaxShareRanges = 32;
  const int64_t threads = ShareCount(pool);
  struct Share {
    int64_t bound[kMaxShareRanges + 1];
    int count = 0;
    std::atomic<uint32_t> ends{0};  // front (low 16 bits) and back (high 16 bits) range indices
  };
  Share shares[kMaxShares];
  for (int64_t t = 0; t < threads; ++t) {
    Share& s = shares[t];
    const int64_t lo = ShareBegin(units, t, threads, tile);
    const int64_t hi = ShareBegin(units, t + 1, threads, tile);
    s.bound[0] = lo;
    while (s.bound[s.count] < hi) {
      const int64_t left = hi - s.bound[s.count];
      const int64_t want = std::max(grain, left / 2);
      const int64_t take =
          s.count + 1 == kMaxShareRanges ? left : std::min(left, (want + tile - 1) / tile * tile);
      s.bound[s.count + 1] = s.bound[s.count] + take;
      ++s.count;
    }
    s.ends.store(static_cast<uint32_t>(s.count) << 16, std::memory_order_relaxed);
  }
  // Takes the front (own share) or the back (another's) range of s; -1 when none is left.
  const auto take = [](Share& s, bool front) -> int {
    uint32_t e = s.ends.load(std::memory_order_relaxed);
    while (true) {
      const uint32_t f = e & 0xffff, b = e >> 16;
      if (f >= b) return -1;
      const uint32_t next = front ? e + 1 : e - (1u << 16);
      if (s.ends.compare_exchange_weak(e, next, std::memory_order_relaxed)) {
        return static_cast<int>(front ? f : b - 1);
      }
    }
  };
  // [first, last) is one part, or all of them when the pool runs the job inline (nested): then
  // the shares run front to back, in order. A part starts on the share of the thread index that
  // runs it, whose start that thread may have prefetched while it waited (next_product.h).
  pool.ParallelFor(threads, 1, [&](int64_t first, int64_t last) {
    if (last - first == 1) {
      first = ThreadPool::ThreadIndex() % threads;
      last = first + 1;
    }
    for (int64_t t = first; t < last; ++t) {
      for (int r; (r = take(shares[t], true)) >= 0;) {
        run_units(shares[t].bound[r], shares[t].bound[r + 1]);
      }
    }
    for (int64_t o = 1; o < threads; ++o) {
      Share& s = shares[(first + o) % threads];
      for (int r; (r = take(s, false)) >= 0;) run_units(s.bound[r], s.bound[r + 1]);
    }
  });
}

}  // namespace kimi::cpu
