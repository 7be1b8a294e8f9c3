// MatMulMany's schedule for one x row (matmul_internal::RunInShares): every unit exactly once, in
// ranges that start on tile boundaries, for many pool sizes and shapes, with the threads finishing
// their own shares at different times so that the others' ranges are taken from the back; each
// thread starting on its own share; and the product sequence behind the idle workers' prefetches.
// Also where a packed group read in several passes spreads its prefetches (SpreadLine).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/next_product.h"
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
    matmul_internal::RunInShares(pool, kUnits, 1, 1, [&](int64_t begin, int64_t end) {
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
        if (s != t && f == matmul_internal::ShareBegin(kUnits, s, kThreads, 1)) ok = false;
      }
    }
    clean += ok;
  }
  EXPECT_GE(clean, kRounds * 3 / 4);
}

// The lines ahead of a group read in `passes` passes: each line once, in order, shared out evenly
// over the block visits (never a visit with none while another takes two more), from a whole
// number of groups on, the least that reaches the one-pass distance.
TEST(SpreadPrefetch, EveryLineAheadOnceAndEvenly) {
  for (int64_t block_lines : {8, 2}) {
    for (int64_t passes = 2; passes <= 7; ++passes) {
      for (int64_t nb : {1, 2, 3, 16, 32, 224}) {
        int64_t next = 0, fewest = block_lines, most = 0;
        for (int64_t v = 0; v < passes * nb; ++v) {
          const int64_t begin = matmul_internal::SpreadLine(v, block_lines, passes);
          const int64_t end = matmul_internal::SpreadLine(v + 1, block_lines, passes);
          ASSERT_EQ(begin, next);
          fewest = std::min(fewest, end - begin);
          most = std::max(most, end - begin);
          next = end;
        }
        ASSERT_EQ(next, nb * block_lines) << passes << " passes, " << nb << " blocks";
        EXPECT_LE(most - fewest, 1) << passes << " passes, " << nb << " blocks";
      }
    }
  }
  for (int64_t group_bytes : {512, 3072, 4096, 8192, 16384, 114688}) {
    const int64_t ahead = matmul_internal::SpreadAheadBytes(group_bytes, 8192);
    EXPECT_EQ(ahead % group_bytes, 0) << group_bytes;
    EXPECT_GE(ahead, 8192) << group_bytes;
    EXPECT_LT(ahead - group_bytes, 8192) << group_bytes;
  }
}

// ProductSequence: each product's hint is the shares of the product that followed it last time.
TEST(ProductSequence, HintsWhatFollowedLastTime) {
  using Range = ThreadPool::MemoryRange;
  matmul_internal::ProductSequence seq;
  int a = 0, b = 0, c = 0, d = 0;  // products, named by address
  const Range shares_a[] = {{&a, 1}, {&a, 2}}, shares_b[] = {{&b, 3}, {&b, 4}},
              shares_c[] = {{&c, 5}}, shares_d[] = {{&d, 6}, {&d, 7}, {&d, 8}};
  const auto same = [](matmul_internal::ProductSequence::Shares got, std::span<const Range> want) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].begin != want[i].begin || got[i].bytes != want[i].bytes) return false;
    }
    return true;
  };
  // First pass: nothing known yet.
  EXPECT_TRUE(seq.Note(&a, shares_a).empty());
  EXPECT_TRUE(seq.Note(&b, shares_b).empty());
  EXPECT_TRUE(seq.Note(&c, shares_c).empty());
  // Second pass: each knows its successor; the last one the first.
  EXPECT_TRUE(same(seq.Note(&a, shares_a), shares_b));
  EXPECT_TRUE(same(seq.Note(&b, shares_b), shares_c));
  EXPECT_TRUE(same(seq.Note(&c, shares_c), shares_a));
  // The sequence changes: a is now followed by d, and d by b.
  seq.Note(&a, shares_a);
  EXPECT_TRUE(seq.Note(&d, shares_d).empty());
  seq.Note(&b, shares_b);
  EXPECT_TRUE(same(seq.Note(&a, shares_a), shares_d));
  EXPECT_TRUE(same(seq.Note(&d, shares_d), shares_b));
  // A product run twice in a row is not its own successor.
  seq.Note(&c, shares_c);
  EXPECT_TRUE(same(seq.Note(&c, shares_c), shares_a));
  // A full table starts over but keeps learning.
  std::vector<char> keys(matmul_internal::ProductSequence::kMaxProducts + 10);
  for (char& k : keys) seq.Note(&k, shares_a);
  seq.Note(&a, shares_a);
  seq.Note(&b, shares_b);
  EXPECT_TRUE(same(seq.Note(&a, shares_a), shares_b));
}

}  // namespace
}  // namespace kimi::cpu
