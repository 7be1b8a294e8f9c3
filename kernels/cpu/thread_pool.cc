#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace kimi::cpu {
namespace {

thread_local bool tls_in_worker = false;
thread_local uint32_t tls_context = 0;

int DefaultThreads() {
  if (const char* env = std::getenv("KIMI_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
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

}  // namespace

// One job at a time. The caller publishes it under a sequence lock (`seq` odd while the fields are
// written), bumps `generation` to wake the workers, and then -- like every worker that shows up --
// takes parts from `next` until none are left; it returns once `done` counts every part. Parts are
// fixed index ranges, so results never depend on which thread ran which part; taking them
// dynamically means a worker the machine has descheduled (a busy, shared host) delays nobody: the
// caller runs its parts instead.
//
// Safety of the job fields: a worker announces itself in `active` before reading them and checks
// `seq` before and after; the caller marks `seq` odd and waits for `active` to drain before it
// rewrites them. So a worker either reads a complete job (and, if that job is already finished,
// finds no part left) or backs off.
struct ThreadPool::Shared {
  alignas(64) std::atomic<uint32_t> generation{0};
  alignas(64) std::atomic<uint64_t> seq{0};
  alignas(64) std::atomic<int> active{0};
  alignas(64) std::atomic<int> sleepers{0};
  alignas(64) std::atomic<int64_t> next{0};
  alignas(64) std::atomic<int64_t> done{0};
  alignas(64) const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t parts = 0;
  int64_t chunk = 0;     // items per part when > 0; else n split evenly into `parts`
  uint32_t context = 0;  // the caller's Context(), handed to the workers
  int participants = 0;  // threads (caller included) that may take parts
  bool stop = false;
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

// Takes and runs parts of the current job until none are left.
void RunParts(std::atomic<int64_t>& next, std::atomic<int64_t>& done,
              const std::function<void(int64_t, int64_t)>& fn, int64_t n, int64_t parts,
              int64_t chunk) {
  for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < parts;
       i = next.fetch_add(1, std::memory_order_relaxed)) {
    int64_t begin, end;
    PartRange(n, parts, chunk, i, &begin, &end);
    if (begin < end) fn(begin, end);
    done.fetch_add(1, std::memory_order_release);
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
  shared_->stop = true;
  shared_->generation.fetch_add(1, std::memory_order_seq_cst);
  shared_->generation.notify_all();
  for (auto& t : shared_->threads) t.join();
  delete shared_;
}

ThreadPool& ThreadPool::Global() {
  static ThreadPool* pool = new ThreadPool();  // never destroyed: workers may outlive statics
  return *pool;
}

uint32_t ThreadPool::Context() { return tls_context; }
void ThreadPool::SetContext(uint32_t context) { tls_context = context; }

void ThreadPool::SetActiveThreads(int n) {
  active_ = n <= 0 ? num_threads_ : std::min(n, num_threads_);
}

void ThreadPool::WorkerLoop(int index) {
  tls_in_worker = true;
  Shared& s = *shared_;
  uint32_t seen = 0;
  uint64_t finished_seq = 0;  // the last job this worker took part in
  for (;;) {
    // Spin while jobs come back to back, yield the core after a few microseconds (so a caller
    // sharing it with us can run), and sleep once the pool has been idle for the spin budget.
    uint32_t g = s.generation.load(std::memory_order_acquire);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; g == seen; ++i) {
      CpuRelax();
      if (i % 64 == 0) {
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited > s.spin) {
          s.sleepers.fetch_add(1, std::memory_order_seq_cst);
          s.generation.wait(seen, std::memory_order_seq_cst);
          s.sleepers.fetch_sub(1, std::memory_order_relaxed);
        } else if (waited > kPureSpin) {
          std::this_thread::yield();
        }
      }
      g = s.generation.load(std::memory_order_acquire);
    }
    seen = g;
    if (s.stop) return;
    // Join the current job, if it is complete and new to us (see Shared).
    s.active.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t s1 = s.seq.load(std::memory_order_seq_cst);
    if (s1 % 2 == 0 && s1 != finished_seq) {
      const std::function<void(int64_t, int64_t)>* fn = s.fn;
      const int64_t n = s.n, parts = s.parts, chunk = s.chunk;
      const uint32_t context = s.context;
      const int participants = s.participants;
      if (s.seq.load(std::memory_order_seq_cst) == s1 && index < participants) {
        tls_context = context;
        RunParts(s.next, s.done, *fn, n, parts, chunk);
        finished_seq = s1;
      }
    }
    s.active.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ThreadPool::Run(int64_t n, int64_t parts, int64_t chunk,
                     const std::function<void(int64_t, int64_t)>& fn) {
  Shared& s = *shared_;
  // Close the previous job to late workers, wait until none is inside it, then publish.
  s.seq.fetch_add(1, std::memory_order_seq_cst);  // odd: writing
  for (int i = 1; s.active.load(std::memory_order_seq_cst) != 0; ++i) {
    CpuRelax();
    if (i % 64 == 0) std::this_thread::yield();
  }
  s.fn = &fn;
  s.n = n;
  s.parts = parts;
  s.chunk = chunk;
  s.context = tls_context;
  s.participants = static_cast<int>(std::min<int64_t>(active_, parts));
  s.next.store(0, std::memory_order_relaxed);
  s.done.store(0, std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_seq_cst);  // even: published
  s.generation.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) s.generation.notify_all();
  tls_in_worker = true;
  RunParts(s.next, s.done, fn, n, parts, chunk);
  tls_in_worker = false;
  // Wait for parts other threads took: spin briefly, then yield so a worker descheduled onto
  // this core gets to finish its part instead of watching us spin.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; s.done.load(std::memory_order_acquire) != parts; ++i) {
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kPureSpin) {
      std::this_thread::yield();
    }
  }
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
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t parts = (n + chunk - 1) / chunk;
  if (parts <= 1 || active_ <= 1 || tls_in_worker) {
    fn(0, n);
    return;
  }
  Run(n, parts, chunk, fn);
}

}  // namespace kimi::cpu
