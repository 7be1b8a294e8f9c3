#include "scheduler/allocators.h"

#include <set>

#include "gtest/gtest.h"

namespace kimi::sched {
namespace {

TEST(SlotAllocator, HandsOutEachSlotOnce) {
  SlotAllocator a(3);
  std::set<int64_t> got;
  for (int i = 0; i < 3; ++i) got.insert(*a.Acquire());
  EXPECT_EQ(got.size(), 3u);
  EXPECT_FALSE(a.Acquire().has_value());
  EXPECT_EQ(a.used(), 3);
  a.Release(1);
  EXPECT_EQ(*a.Acquire(), 1);
}

TEST(PageAllocator, RefcountsShareAndFree) {
  PageAllocator a(2);
  const int32_t p = *a.Acquire();
  a.Ref(p);
  EXPECT_EQ(a.refs(p), 2);
  a.Unref(p);
  EXPECT_EQ(a.free(), 1);  // still held once
  a.Unref(p);
  EXPECT_EQ(a.free(), 2);
}

}  // namespace
}  // namespace kimi::sched
