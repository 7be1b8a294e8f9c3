// The product sequence behind the idle workers' prefetches (MatMulMany's schedule for one x row is
// RunInShares, tested with the thread pool), and where a packed group read in several passes
// spreads its prefetches (SpreadLine).
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/next_product.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

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
