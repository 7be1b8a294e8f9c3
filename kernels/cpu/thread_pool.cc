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

// The job slot is written by the caller before it bumps `generation` (release) and read by the
// workers after they see the bump (acquire). Every worker acknowledges every generation through
// `pending`, participating or not, so the caller never rewrites the slot while one still reads it.
struct ThreadPool::Shared {
  alignas(64) std::atomic<uint32_t> generation{0};
  alignas(64) std::atomic<int> pending{0};
  alignas(64) std::atomic<int> sleepers{0};
  alignas(64) const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int parts = 0;
  uint32_t context = 0;  // the caller's Context(), handed to the workers
  bool stop = false;
  std::chrono::microseconds spin{0};
  std::vector<std::thread> threads;
};

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

static void RunPart(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int parts, int i) {
  if (i >= parts) return;
  const int64_t begin = n * i / parts;
  const int64_t end = n * (i + 1) / parts;
  if (begin < end) fn(begin, end);
}

void ThreadPool::WorkerLoop(int index) {
  tls_in_worker = true;
  Shared& s = *shared_;
  uint32_t seen = 0;
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
    tls_context = s.context;
    RunPart(*s.fn, s.n, s.parts, index);
    s.pending.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int parts = static_cast<int>(std::min<int64_t>(active_, (n + grain - 1) / grain));
  if (parts <= 1 || tls_in_worker) {
    fn(0, n);
    return;
  }
  Shared& s = *shared_;
  s.fn = &fn;
  s.n = n;
  s.parts = parts;
  s.context = tls_context;
  s.pending.store(num_threads_ - 1, std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) s.generation.notify_all();
  tls_in_worker = true;
  RunPart(fn, n, parts, 0);
  tls_in_worker = false;
  // Wait for the workers: spin briefly, then yield so a worker descheduled onto this core (a busy
  // machine) gets to finish its part instead of watching us spin.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; s.pending.load(std::memory_order_acquire) != 0; ++i) {
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kPureSpin) {
      std::this_thread::yield();
    }
  }
}

}  // namespace kimi::cpu
