#include "scheduler/prefix_cache.h"

#include <numeric>

#include "gtest/gtest.h"

namespace kimi::sched {
namespace {

TEST(PrefixCache, DeepestMatchingBoundaryAndPageRefs) {
  PageAllocator pages(16);
  std::vector<int64_t> dropped;
  PrefixCache cache(/*interval=*/8, /*page_size=*/4, /*max_bytes=*/1 << 20, /*snapshot_bytes=*/12,
                    &pages, [&](int64_t h) { dropped.push_back(h); });
  std::vector<int32_t> tokens(20);
  std::iota(tokens.begin(), tokens.end(), 100);
  std::vector<int32_t> held;
  for (int i = 0; i < 5; ++i) held.push_back(*pages.Acquire());
  cache.Insert(std::span(tokens).first(8), /*handle=*/101, held);
  cache.Insert(std::span(tokens).first(16), /*handle=*/102, held);
  cache.Insert(std::span(tokens).first(16), /*handle=*/103, held);  // already cached: dropped
  EXPECT_EQ(dropped, std::vector<int64_t>{103});
  EXPECT_EQ(pages.refs(held[0]), 3);  // the request + two entries
  EXPECT_EQ(pages.refs(held[3]), 2);  // only the 16-token entry covers page 3
  EXPECT_EQ(pages.refs(held[4]), 1);

  PrefixCache::Hit h = cache.Lookup(tokens, 19);
  EXPECT_EQ(h.tokens, 16);
  EXPECT_EQ(h.handle, 102);
  EXPECT_EQ(h.pages.size(), 4u);
  h = cache.Lookup(tokens, 15);  // clamped below the deeper snapshot
  EXPECT_EQ(h.tokens, 8);
  std::vector<int32_t> other = tokens;
  other[9] = 7;  // differs inside the second block
  EXPECT_EQ(cache.Lookup(other, 19).tokens, 8);
  other[0] = 7;
  EXPECT_EQ(cache.Lookup(other, 19).tokens, 0);
  EXPECT_EQ(cache.queries(), 4);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.saved_tokens(), 32);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedAndReleasesPages) {
  PageAllocator pages(8);
  std::vector<int64_t> dropped;
  // Room for two 8-byte snapshots.
  PrefixCache cache(4, 4, 16, 8, &pages, [&](int64_t h) { dropped.push_back(h); });
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c = {9, 10, 11, 12};
  const int32_t pa = *pages.Acquire(), pb = *pages.Acquire(), pc = *pages.Acquire();
  cache.Insert(a, 1, std::vector<int32_t>{pa});
  cache.Insert(b, 2, std::vector<int32_t>{pb});
  EXPECT_EQ(cache.Lookup(a, 4).tokens, 4);  // a is now the most recent
  cache.Insert(c, 3, std::vector<int32_t>{pc});
  EXPECT_EQ(cache.Lookup(b, 4).tokens, 0);  // b was evicted
  EXPECT_EQ(dropped, std::vector<int64_t>{2});
  EXPECT_EQ(cache.Lookup(a, 4).tokens, 4);
  EXPECT_EQ(pages.refs(pb), 1);
  for (int32_t p : {pa, pb, pc}) pages.Unref(p);
  EXPECT_EQ(pages.free(), 6);  // pa, pc still held by entries
  EXPECT_TRUE(cache.FreePages(8));
  EXPECT_EQ(cache.entries(), 0);
  EXPECT_EQ(dropped.size(), 3u);
}

// FreePages drops nothing when even every entry would not free enough (a request still holds their
// pages): every reservation that failed anyway wiped the cache. Lookups asked not to count leave
// the figures to Count.
TEST(PrefixCache, KeepsEntriesWhenDroppingThemCannotHelp) {
  PageAllocator pages(4);
  std::vector<int64_t> dropped;
  PrefixCache cache(4, 4, 1 << 20, 8, &pages, [&](int64_t h) { dropped.push_back(h); });
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  const int32_t pa = *pages.Acquire(), pb = *pages.Acquire();
  cache.Insert(a, 1, std::vector<int32_t>{pa});
  cache.Insert(b, 2, std::vector<int32_t>{pb});
  pages.Unref(pb);  // b's page is the cache's alone; a's is still a request's
  EXPECT_EQ(pages.free(), 2);
  EXPECT_FALSE(cache.FreePages(4));  // dropping both frees one page: 3 < 4
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(cache.Lookup(a, 4, /*count=*/false).tokens, 4);
  EXPECT_EQ(cache.queries(), 0);
  cache.Count(4);
  EXPECT_EQ(cache.queries(), 1);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.saved_tokens(), 4);
  EXPECT_TRUE(cache.FreePages(3));  // enough once b goes
  EXPECT_EQ(pages.free(), 3);
  pages.Unref(pa);
}

}  // namespace
}  // namespace kimi::sched
