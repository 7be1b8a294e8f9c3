// MatMulMany's schedule for one x row (matmul_internal::RunInShares): every unit exactly once, in
// ranges that start on tile boundaries, for many pool sizes and shapes, with the threads finishing
// their own shares at different times so that the others' ranges are taken from the back.
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

TEST(RunInShares, EveryUnitOnceInTileAlignedRanges) {
  for (int threads : {1, 2, 3, 5, 17}) {
    ThreadPool pool(threads);
    for (int64_t units : {1, 2, 7, 64, 333, 4096}) {
      for (int64_t grain : {1, 3, 50}) {
        for (int64_t tile : {1, 3}) {
          std::vector<std::atomic<int>> seen(units);
          std::atomic<int> bad{0};
          matmul_internal::RunInShares(pool, units, grain, tile, [&](int64_t begin, int64_t end) {
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
      matmul_internal::RunInShares(pool, kUnits, 1, 1, [&](int64_t begin, int64_t end) {
        if (begin < kUnits / threads) std::this_thread::sleep_for(std::chrono::microseconds(200));
        for (int64_t u = begin; u < end; ++u) seen[u].fetch_add(1);
      });
      for (int64_t u = 0; u < kUnits; ++u) ASSERT_EQ(seen[u].load(), 1) << "unit " << u;
    }
  }
}

}  // namespace
}  // namespace kimi::cpu
