// A fixed pool of worker threads for data-parallel kernels.
//
// Thread contract: ParallelFor may be called from one thread at a time per pool (the engine
// thread). A call made from inside a worker runs inline, so kernels can nest without deadlock. Work
// is split into contiguous ranges by index only, never by timing, so results do not depend on
// scheduling; which thread runs a range is decided at run time (the caller runs the ranges of a
// worker the machine has not scheduled yet, so a busy host slows a job down rather than stalling
// it).
//
// Dispatch is lock-free: the caller publishes the job in one cache line under a sequence number;
// workers spin on it for a short while (KIMI_SPIN_US, default 300 us; yielding the core after 20
// us) and then sleep on a futex, so a decode step's hundreds of short jobs cost about a microsecond
// each to hand out, and an idle pool costs no CPU. While they wait, threads prefetch the memory
// the caller named with SetIdleHints. The pool defaults to one thread per CPU the process may use
// (its affinity mask and cgroup CPU quota: cpu_budget.h), the caller included: it never
// oversubscribes.
#pragma once

#include <cstdint>
#include <functional>

namespace kimi::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 means one per usable CPU (or $KIMI_NUM_THREADS).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads ParallelFor uses now (<= the threads the pool was built with).
  int num_threads() const { return active_; }
  // Limits ParallelFor to the first `n` threads (1 .. built size; 0 restores the built size).
  // For benchmarks that compare thread counts; call it between jobs, from the calling thread.
  void SetActiveThreads(int n);

  // Calls fn(begin, end) over a partition of [0, n) into at most num_threads() ranges of at least
  // `grain` items, and returns when all are done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Calls fn(begin, end) over the ranges [i * chunk, (i + 1) * chunk) of [0, n), handed out to the
  // threads as they become free (load balancing when parts or threads run at uneven speeds).
  void ParallelForChunks(int64_t n, int64_t chunk,
                         const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool the kernels use.
  static ThreadPool& Global();

  // True on a thread running a part of a parallel job (a worker, or the caller taking its share):
  // a ParallelFor from there runs inline, on that thread alone.
  static bool InParallelSection();

  // The calling thread's index in its pool: 0 for the thread that calls ParallelFor, 1 ..
  // num_threads() - 1 for the workers.
  static int ThreadIndex();

  // Memory for waiting threads to prefetch: while worker i waits for the next job (the caller is
  // running serial code, or finishing its part) it prefetches by_thread[i] into its caches, and
  // the caller by_thread[0] while it waits for the workers' parts; each range once, entries past
  // the pool's threads ignored. A product names the start of each thread's share of the product
  // expected next (kernels/cpu/next_product.h), so the waits load it. Replaces the previous
  // hints; from the calling thread.
  struct MemoryRange {
    const void* begin = nullptr;
    int64_t bytes = 0;
  };
  void SetIdleHints(const MemoryRange* by_thread, int count);

  // A word of per-thread kernel settings (e.g. the activation precision, kernels/cpu/matmul.h)
  // that every ParallelFor hands from the calling thread to the workers running its parts, so
  // nested kernels see the caller's settings whichever thread runs them.
  static uint32_t Context();
  static void SetContext(uint32_t context);

 private:
  struct Shared;
  void WorkerLoop(int index);
  void Run(int64_t n, int64_t parts, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn);

  int num_threads_;
  int active_;
  Shared* shared_;
};

// Shorthand for ThreadPool::Global().ParallelFor.
inline void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::Global().ParallelFor(n, grain, fn);
}

// Returns once done() holds, waiting as the pool's threads do: spinning with a pause between
// looks, then yielding the core after a few microseconds, so that a thread descheduled onto this
// core gets to finish what is awaited. For a part of a parallel job that needs another part's
// result, and for ThreadPool::Run's wait for the parts others took. idle_work, when given, runs
// before each pause and returns whether it did something (no pause then).
void WaitUntil(const std::function<bool()>& done, const std::function<bool()>& idle_work = nullptr);

// Shares of a pool's work (RunInShares): one per thread, at most kMaxShares; share t of `shares`
// begins at unit ShareBegin(units, t, shares, tile) (a whole tile; ShareBegin(units, shares, ...) =
// units).
inline constexpr int kMaxShares = 16;
int ShareCount(const ThreadPool& pool);
int64_t ShareBegin(int64_t units, int64_t t, int64_t shares, int64_t tile);

// Calls run(begin, end) over ranges that cover [0, units) once each, on the pool's threads: every
// thread starts on a contiguous share of its own, front to back, in ranges of halving length (whole
// tiles, at least `grain` units, except a share's last), then takes the others' last ranges. So a
// thread that runs its share at the speed the others run theirs reads only its own units (what it
// prefetched for them stays useful), and one that falls behind is helped from the back. Run nested
// (inline), the shares run front to back, in order.
void RunInShares(ThreadPool& pool, int64_t units, int64_t grain, int64_t tile,
                 const std::function<void(int64_t, int64_t)>& run);

}  // namespace kimi::cpu
