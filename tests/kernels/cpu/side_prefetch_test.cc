// The side prefetch's contract (kernels/cpu/side_prefetch.h): each thread is handed its own ranges,
// in order, in whole 64-byte lines and pieces of at most 32 KiB, until they are done or cleared;
// and a product that prefetches them on the side computes the same bits as one that does not.
#include "kernels/cpu/side_prefetch.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

uintptr_t LineDown(const void* p) { return reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; }
uintptr_t LineUp(const void* p, int64_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) + bytes + 63) & ~uintptr_t{63};
}

// The calling thread's pieces until none is left, each [p, end).
std::vector<SidePiece> ClaimAll() {
  std::vector<SidePiece> pieces;
  for (SidePiece s = ClaimSidePiece(); s.p < s.end; s = ClaimSidePiece()) pieces.push_back(s);
  return pieces;
}

TEST(SidePrefetchTest, HandsOutTheThreadsRangesInOrderInWholeLines) {
  std::vector<char> buffer(200000);
  const std::vector<SideRanges> by_thread = {
      {{buffer.data() + 10, 100000}, {buffer.data() + 150000, 1000}}};
  SetSidePrefetch(by_thread);
  EXPECT_TRUE(SidePrefetchActive());
  const std::vector<SidePiece> pieces = ClaimAll();  // this thread is thread 0 of the pool
  // The first range's lines, then the second's, each piece contiguous with the one before.
  uintptr_t at = LineDown(buffer.data() + 10);
  size_t i = 0;
  for (const auto& [begin, bytes] :
       {std::pair<const char*, int64_t>{buffer.data() + 10, 100000},
        std::pair<const char*, int64_t>{buffer.data() + 150000, 1000}}) {
    at = LineDown(begin);
    while (at < LineUp(begin, bytes)) {
      ASSERT_LT(i, pieces.size());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pieces[i].p), at);
      const int64_t len = pieces[i].end - pieces[i].p;
      EXPECT_GT(len, 0);
      EXPECT_LE(len, 32 << 10);
      EXPECT_EQ(len % 64, 0);
      at += static_cast<uintptr_t>(len);
      ++i;
    }
    EXPECT_EQ(at, LineUp(begin, bytes));
  }
  EXPECT_EQ(i, pieces.size());
  ClearSidePrefetch();
  EXPECT_FALSE(SidePrefetchActive());
}

TEST(SidePrefetchTest, ClearingDropsWhatIsLeftAndAThreadWithoutRangesGetsNone) {
  std::vector<char> buffer(1 << 20);
  const std::vector<SideRanges> mine = {{{buffer.data(), 1 << 20}}};
  SetSidePrefetch(mine);
  const SidePiece first = ClaimSidePiece();
  EXPECT_LT(first.p, first.end);
  ClearSidePrefetch();
  EXPECT_TRUE(ClaimAll().empty());
  // Ranges for thread 1 only: thread 0 (this one) gets nothing.
  const std::vector<SideRanges> others = {{}, {{buffer.data(), 4096}}};
  SetSidePrefetch(others);
  EXPECT_TRUE(ClaimAll().empty());
  ClearSidePrefetch();
}

// Packed bf16 products (the loops that take the side prefetch on AVX-512 and AMX) at a few x row
// counts, with and without ranges to prefetch: the same bits; on those the products took some of
// them.
TEST(SidePrefetchTest, ProductsComputeTheSameBitsWhilePrefetching) {
  constexpr int64_t n = 256, k = 512;
  const std::vector<float> v = testing::RandomVector(n * k, 3);
  std::vector<uint16_t> data(n * k);
  for (int64_t i = 0; i < n * k; ++i) data[i] = F32ToBf16(v[i]);
  Weight w;
  w.data = data.data();
  w.format = WeightFormat::kBF16;
  w.rows = n;
  w.cols = k;
  PackInPlace(&w);
  ASSERT_TRUE(w.packed);
  const int threads = ThreadPool::Global().num_threads();
  std::vector<std::vector<char>> states(threads, std::vector<char>(4 << 20));
  // All threads, then the calling thread alone: only the calling thread's ranges can be looked at
  // from here (ClaimSidePiece hands out the caller's own), and with workers it may run no part of
  // a small product (parts go to whichever thread takes them first).
  for (const int active : {threads, 1}) {
    ThreadPool::Global().SetActiveThreads(active);
    for (int64_t m : {2, 8, 20, 33}) {
      const std::vector<float> x = testing::RandomVector(m * k, 4);
      std::vector<float> plain(m * n), side(m * n);
      MatMul(plain.data(), x.data(), w, m);
      std::vector<SideRanges> by_thread(threads);
      for (int t = 0; t < threads; ++t) by_thread[t].push_back({states[t].data(), 4 << 20});
      SetSidePrefetch(by_thread);
      MatMul(side.data(), x.data(), w, m);
      int64_t left = 0;
      for (const SidePiece& s : ClaimAll()) left += s.end - s.p;
      ClearSidePrefetch();
      EXPECT_EQ(plain, side) << m << " rows, " << active << " threads";
      if (active == 1 && HasAvx512(MatMulIsa())) {  // AVX-512's group loops, or AMX's tile loop
        EXPECT_LT(left, 4 << 20) << m << " rows";
      }
    }
  }
  ThreadPool::Global().SetActiveThreads(0);
}

}  // namespace
}  // namespace kimi::cpu
