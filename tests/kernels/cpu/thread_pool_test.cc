// The thread pool's contract (kernels/cpu/thread_pool.h): every index runs exactly once, in at
// most one range per thread (ParallelFor) or in whole chunks (ParallelForChunks), nested calls run
// inline, the caller's context reaches the workers, jobs stay correct when workers are late (more
// threads than cores, so some are descheduled), each thread keeps its index, and idle hints at any
// address are harmless; RunInShares hands out every unit once, each thread starting on its own
// share.
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kimi::cpu {
namespace {

// Runs `n` items through ParallelFor (chunk == 0) or ParallelForChunks and checks that each index
// was visited exactly once, in ranges of whole chunks or at most one per thread.
void ExpectEachIndexOnce(ThreadPool& pool, int64_t n, int64_t grain, int64_t chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> ranges{0};
  std::atomic<bool> bad_range{false};
  const auto fn = [&](int64_t begin, int64_t end) {
    if (begin >= end || begin < 0 || end > n) bad_range = true;
    if (chunk > 0 && (begin % chunk != 0 || (end - begin != chunk && end != n))) bad_range = true;
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    ranges.fetch_add(1);
  };
  if (chunk > 0) {
    pool.ParallelForChunks(n, chunk, fn);
  } else {
    pool.ParallelFor(n, grain, fn);
  }
  ASSERT_FALSE(bad_range) << "n " << n << " grain " << grain << " chunk " << chunk;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  }
  if (chunk == 0 && n > 0) {
    EXPECT_LE(ranges.load(), pool.num_threads());
  }
}

TEST(ThreadPool, EveryIndexRunsOnceForManyShapes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      for (int64_t grain : {1, 3, 100}) ExpectEachIndexOnce(pool, n, grain, 0);
      for (int64_t chunk : {1, 4, 33}) ExpectEachIndexOnce(pool, n, 0, chunk);
    }
  }
}

TEST(ThreadPool, ActiveThreadsLimitTheRanges) {
  ThreadPool pool(4);
  for (int active : {1, 2, 3, 4}) {
    pool.SetActiveThreads(active);
    EXPECT_EQ(pool.num_threads(), active);
    std::atomic<int> ranges{0};
    pool.ParallelFor(100, 1, [&](int64_t, int64_t) { ranges.fetch_add(1); });
    EXPECT_EQ(ranges.load(), active);
  }
  pool.SetActiveThreads(0);
  EXPECT_EQ(pool.num_threads(), 4);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(12 * 10);
  pool.ParallelFor(12, 1, [&](int64_t b0, int64_t e0) {
    for (int64_t i = b0; i < e0; ++i) {
      pool.ParallelFor(10, 1, [&](int64_t b1, int64_t e1) {
        EXPECT_EQ(b1, 0);  // inline: one range covering everything
        EXPECT_EQ(e1, 10);
        for (int64_t j = b1; j < e1; ++j) hits[static_cast<size_t>(i * 10 + j)].fetch_add(1);
      });
    }
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, WorkersSeeTheCallersContext) {
  ThreadPool pool(3);
  const uint32_t saved = ThreadPool::Context();
  for (uint32_t context : {7u, 0u, 12345u}) {
    ThreadPool::SetContext(context);
    std::atomic<int> wrong{0};
    pool.ParallelForChunks(64, 1, [&](int64_t, int64_t) {
      if (ThreadPool::Context() != context) wrong.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));  // let every worker take parts
    });
    EXPECT_EQ(wrong.load(), 0) << "context " << context;
  }
  ThreadPool::SetContext(saved);
}

// Many short jobs back to back on more threads than the machine has cores: workers are often
// descheduled mid-job and join late, after the caller has moved on. Results must stay exact.
TEST(ThreadPool, BackToBackJobsWithLateWorkers) {
  const int threads = 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) + 1;
  ThreadPool pool(threads);
  std::vector<int64_t> sums(64);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int jobs = 0;
  for (; jobs < 20000 && std::chrono::steady_clock::now() < deadline; ++jobs) {
    const int64_t n = 1 + jobs % 64;
    std::fill(sums.begin(), sums.end(), 0);
    const auto fn = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sums[static_cast<size_t>(i)] += i + jobs;
    };
    if (jobs % 2 == 0) {
      pool.ParallelFor(n, 1, fn);
    } else {
      pool.ParallelForChunks(n, 1 + jobs % 5, fn);
    }
    for (int64_t i = 0; i < 64; ++i) {
      ASSERT_EQ(sums[static_cast<size_t>(i)], i < n ? i + jobs : 0) << "job " << jobs;
    }
  }
  EXPECT_GT(jobs, 100);
}

// A pool idle past its spin budget puts its workers to sleep; the next job must wake them (or run
// on the caller) and finish.
TEST(ThreadPool, JobsAfterIdlePeriodsComplete) {
  ThreadPool pool(3);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // > the default 300 us spin
    ExpectEachIndexOnce(pool, 50, 1, 0);
    ExpectEachIndexOnce(pool, 50, 0, 2);
  }
}

// Each thread keeps one index: the caller 0, the workers 1 .. threads - 1.
TEST(ThreadPool, EachThreadHasItsOwnIndex) {
  constexpr int kThreads = 3;
  ThreadPool pool(kThreads);
  EXPECT_EQ(ThreadPool::ThreadIndex(), 0);
  std::mutex mu;
  std::map<std::thread::id, std::set<int>> seen;
  for (int round = 0; round < 20; ++round) {
    pool.ParallelForChunks(64, 1, [&](int64_t, int64_t) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
      while (std::chrono::steady_clock::now() < until) {
      }
      std::lock_guard<std::mutex> lock(mu);
      seen[std::this_thread::get_id()].insert(ThreadPool::ThreadIndex());
    });
  }
  std::set<int> indices;
  for (const auto& [thread, index] : seen) {
    ASSERT_EQ(index.size(), 1u) << "a thread changed its index";
    const int i = *index.begin();
    EXPECT_GE(i, 0);
    EXPECT_LT(i, kThreads);
    EXPECT_EQ(i == 0, thread == std::this_thread::get_id()) << "index " << i;
    EXPECT_TRUE(indices.insert(i).second) << "two threads with index " << i;
  }
}

// Idle hints are prefetched, never read: ranges at any address (null, unmapped, past a buffer's
// end), of any length, more entries than threads, and hints replaced between jobs leave the jobs'
// results as they are and the process alive.
TEST(ThreadPool, IdleHintsAtAnyAddressAreHarmless) {
  ThreadPool pool(3);
  std::vector<char> buffer(1 << 20);
  const ThreadPool::MemoryRange hints[] = {
      {nullptr, 1 << 20},
      {reinterpret_cast<const void*>(uintptr_t{4096}), 1 << 20},
      {buffer.data() + buffer.size() - 64, 1 << 20},
      {buffer.data(), -5},
      {buffer.data(), 1 << 20}};
  for (int round = 0; round < 40; ++round) {
    const int first = round % 5, count = round % 7;
    std::vector<ThreadPool::MemoryRange> by_thread;
    for (int i = 0; i < count; ++i) by_thread.push_back(hints[(first + i) % 5]);
    pool.SetIdleHints(by_thread.data(), count);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the workers wait, prefetching
    ExpectEachIndexOnce(pool, 100 + round, 1, 0);
    ExpectEachIndexOnce(pool, 100 + round, 0, 3);
  }
}

TEST(ThreadPool, PoolsStartAndStopRepeatedly) {
  for (int i = 0; i < 20; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 2 == 0) ExpectEachIndexOnce(pool, 10, 1, 0);
  }
}

// WaitUntil: a part that needs another part's result waits for it, also when the pool has more
// threads than the machine has cores (the awaited thread may be descheduled).
TEST(ThreadPool, WaitUntilSeesAnotherPartsResult) {
  for (int threads : {2, 5}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 20; ++round) {
      std::atomic<int> ready{0}, seen{0};
      pool.ParallelFor(2, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          if (i == 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
            ready.store(1, std::memory_order_release);
          } else {
            WaitUntil([&] { return ready.load(std::memory_order_acquire) == 1; });
            seen.store(1);
          }
        }
      });
      ASSERT_EQ(seen.load(), 1) << threads << " threads, round " << round;
    }
  }
}

// RunInShares: every unit exactly once, in ranges that start on tile boundaries, for many pool
// sizes and shapes, with the threads finishing their own shares at different times so that the
// others' ranges are taken from the back; each thread starting on its own share.
TEST(RunInShares, EveryUnitOnceInTileAlignedRanges) {
  for (int threads : {1, 2, 3, 5, 17}) {
    ThreadPool pool(threads);
    for (int64_t units : {1, 2, 7, 64, 333, 4096}) {
      for (int64_t grain : {1, 3, 50}) {
        for (int64_t tile : {1, 3}) {
          std::vector<std::atomic<int>> seen(units);
          std::atomic<int> bad{0};
          RunInShares(pool, units, grain, tile, [&](int64_t begin, int64_t end) {
            if (begin >= end || begin < 0 || end > units || begin % tile != 0) bad.fetch_add(1);
            for (int64_t u = begin; u < end && u < units; ++u) seen[u].fetch_add(1);
          });
          ASSERT_EQ(bad.load(), 0) << threads << " " << units << " " << grain << " " << tile;
          for (int64_t u = 0; u < units; ++u) {
            ASSERT_EQ(seen[u].load(), 1)
                << "unit " << u << " of " << units << ", threads " << threads;
          }
        }
      }
    }
  }
}

// The first share's ranges are slow, so the other threads finish early and take its ranges from
// the back while its owner takes them from the front.
TEST(RunInShares, SlowShareIsFinishedByTheOthersOnce) {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    constexpr int64_t kUnits = 400;
    for (int round = 0; round < 5; ++round) {
      std::vector<std::atomic<int>> seen(kUnits);
      RunInShares(pool, kUnits, 1, 1, [&](int64_t begin, int64_t end) {
        if (begin < kUnits / threads) std::this_thread::sleep_for(std::chrono::microseconds(200));
        for (int64_t u = begin; u < end; ++u) seen[u].fetch_add(1);
      });
      for (int64_t u = 0; u < kUnits; ++u) ASSERT_EQ(seen[u].load(), 1) << "unit " << u;
    }
  }
}

// A thread starts on the front of its own share (whose start it may have prefetched while it
// waited), never on another's: others' ranges are only taken from the back, and the front range
// (half a share) is the last of them. Three threads on any number of cores: a thread the machine
// runs late still finds its front range unless the others finished their own shares and all of
// its share first, so nearly every round is clean (20 of 20 in ten runs on 2 cores); shares taken
// in the order the threads arrive gave 0-20 clean rounds (median 12) in ten runs.
TEST(RunInShares, ThreadsStartOnTheFrontOfTheirOwnShare) {
  constexpr int kThreads = 3;
  constexpr int64_t kUnits = 3 * 128;
  ThreadPool pool(kThreads);
  int clean = 0;
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<int64_t> first[kThreads];
    for (auto& f : first) f = -1;
    RunInShares(pool, kUnits, 1, 1, [&](int64_t begin, int64_t end) {
      int64_t none = -1;
      first[ThreadPool::ThreadIndex()].compare_exchange_strong(none, begin);
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(2 * (end - begin));
      while (std::chrono::steady_clock::now() < until) {
      }
    });
    bool ok = true;
    for (int t = 0; t < kThreads; ++t) {
      const int64_t f = first[t].load();
      if (f < 0) continue;  // this thread ran nothing
      for (int s = 0; s < kThreads; ++s) {
        if (s != t && f == ShareBegin(kUnits, s, kThreads, 1)) ok = false;
      }
    }
    clean += ok;
  }
  EXPECT_GE(clean, kRounds * 3 / 4);
}

}  // namespace
}  // namespace kimi::cpu
