#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace kimi::cpu {
namespace {

thread_local bool tls_in_worker = false;

int DefaultThreads() {
  if (const char* env = std::getenv("KIMI_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

// Workers wait for a new generation number, run their range, and count down `pending`.
// They spin briefly before sleeping: a decode step issues hundreds of short jobs back to back.
struct ThreadPool::Shared {
  std::mutex mu;
  std::condition_variable wake;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};
  bool stop = false;
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int parts = 0;
  std::vector<std::thread> threads;
};

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : DefaultThreads()), shared_(new Shared) {
  for (int i = 1; i < num_threads_; ++i) {
    shared_->threads.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;
    shared_->generation.fetch_add(1);
  }
  shared_->wake.notify_all();
  for (auto& t : shared_->threads) t.join();
  delete shared_;
}

ThreadPool& ThreadPool::Global() {
  static ThreadPool* pool = new ThreadPool();  // never destroyed: workers may outlive statics
  return *pool;
}

static void RunPart(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int parts, int i) {
  if (i >= parts) return;
  const int64_t begin = n * i / parts;
  const int64_t end = n * (i + 1) / parts;
  if (begin < end) fn(begin, end);
}

void ThreadPool::WorkerLoop(int index) {
  tls_in_worker = true;
  uint64_t seen = 0;
  for (;;) {
    // Spin for a short while, then block.
    int spins = 0;
    while (shared_->generation.load(std::memory_order_acquire) == seen && spins < 20000) {
      ++spins;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    if (shared_->generation.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(shared_->mu);
      shared_->wake.wait(lock, [&] { return shared_->generation.load() != seen; });
    }
    seen = shared_->generation.load(std::memory_order_acquire);
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n;
    int parts;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (shared_->stop) return;
      fn = shared_->fn;
      n = shared_->n;
      parts = shared_->parts;
    }
    RunPart(*fn, n, parts, index);
    shared_->pending.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int parts = static_cast<int>(std::min<int64_t>(num_threads_, (n + grain - 1) / grain));
  if (parts <= 1 || tls_in_worker) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->fn = &fn;
    shared_->n = n;
    shared_->parts = parts;
    shared_->pending.store(num_threads_ - 1, std::memory_order_relaxed);
    shared_->generation.fetch_add(1, std::memory_order_release);
  }
  shared_->wake.notify_all();
  tls_in_worker = true;
  RunPart(fn, n, parts, 0);
  tls_in_worker = false;
  while (shared_->pending.load(std::memory_order_acquire) != 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace kimi::cpu
