// A fixed pool of worker threads for data-parallel kernels.
//
// Thread contract: ParallelFor may be called from one thread at a time per pool (the engine thread).
// A call made from inside a worker runs inline, so kernels can nest without deadlock. Work is split
// into contiguous ranges by index only, never by timing, so results do not depend on scheduling.
#pragma once

#include <cstdint>
#include <functional>

namespace kimi::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 means one per core (or $KIMI_NUM_THREADS).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over a partition of [0, n) into at most num_threads() ranges of at least
  // `grain` items, and returns when all are done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool the kernels use.
  static ThreadPool& Global();

 private:
  struct Shared;
  void WorkerLoop(int index);

  int num_threads_;
  Shared* shared_;
};

// Shorthand for ThreadPool::Global().ParallelFor.
inline void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::Global().ParallelFor(n, grain, fn);
}

}  // namespace kimi::cpu
