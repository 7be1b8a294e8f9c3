#include "engine/step_memory.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <sys/resource.h>

namespace kimi {
namespace {

int64_t MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// A layer holds several buffers at once and frees them together, and the next layer allocates
// them again. With glibc's defaults a block above the mmap threshold is mapped, the threshold then
// rises to that block's size and the trim threshold to twice it, and when the freed buffers at the
// top of the heap add up to more than that they go back to the OS: each cycle below page-faults all
// of its 6144 pages (30592 of 30720 over five cycles in a standalone run). With the policy they
// come back from the heap.
TEST(StepMemoryTest, FreedBuffersComeBackWithoutPageFaults) {
#if !defined(__GLIBC__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the policy is glibc's mallopt (a sanitizer's allocator ignores it)";
#endif
  KeepStepMemory();
  constexpr size_t kBytes = size_t{4} << 20;
  const auto layer = [] {
    std::vector<std::unique_ptr<char[]>> buffers;
    for (int i = 0; i < 6; ++i) {
      buffers.push_back(std::make_unique_for_overwrite<char[]>(kBytes));
      std::memset(buffers.back().get(), 1, kBytes);
    }
  };
  layer();  // the heap grows once
  const int64_t before = MinorFaults();
  for (int i = 0; i < 5; ++i) layer();
  EXPECT_LT(MinorFaults() - before, 100) << "5 x 6144 pages when the buffers go back to the OS";
}

// Blocks from kHeapBlockLimit on would be mapped afresh by glibc on every allocation (and every
// page faulted in again); Scratch keeps them per thread and hands the smallest one that fits back.
// Each test runs on a thread of its own, whose kept blocks start empty.
TEST(StepMemoryTest, LargeScratchBlocksAreKeptAndReused) {
  std::thread([] {
    constexpr int64_t kFloats = int64_t{40} << 18;  // 40 MiB
    float* first = nullptr;
    {
      ScratchBuffer a = Scratch(kFloats);
      first = a.get();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % alignof(std::max_align_t), 0u);
      std::memset(a.get(), 1, kFloats * sizeof(float));
      EXPECT_EQ(KeptScratchBytes(), 0);
    }
    EXPECT_EQ(KeptScratchBytes(), kFloats * int64_t{sizeof(float)});
    // Read only where the fault count is checked below: unused under ASan, whose build has
    // -Werror=unused-variable too.
    [[maybe_unused]] const int64_t faults = MinorFaults();
    {
      ScratchBuffer b = Scratch(kFloats - 1000);  // fits in the kept block
      EXPECT_EQ(b.get(), first);
      EXPECT_EQ(KeptScratchBytes(), 0);
      std::memset(b.get(), 2, (kFloats - 1000) * sizeof(float));
    }
#if !defined(__SANITIZE_ADDRESS__)
    EXPECT_LT(MinorFaults() - faults, 100) << "10240 pages when the block is mapped afresh";
#endif
    ScratchBuffer larger = Scratch(kFloats + 16);  // does not fit: a new block
    EXPECT_NE(larger.get(), first);
    EXPECT_EQ(KeptScratchBytes(), kFloats * int64_t{sizeof(float)});
    ScratchBuffer small = Scratch(1000);
    small.reset();  // from the heap, never kept
    EXPECT_EQ(KeptScratchBytes(), kFloats * int64_t{sizeof(float)});
  }).join();
}

TEST(StepMemoryTest, AtMostFourLargeScratchBlocksAreKeptTheLargest) {
  std::thread([] {
    std::vector<ScratchBuffer> blocks;
    int64_t bytes[6], all = 0;
    for (int i = 0; i < 6; ++i) {
      const int64_t floats = (int64_t{38} - i) << 18;  // 38 .. 33 MiB
      bytes[i] = floats * int64_t{sizeof(float)};
      all += bytes[i];
      blocks.push_back(Scratch(floats));
    }
    for (int i = 5; i >= 0; --i) blocks[i].reset();  // the smallest first
    ASSERT_EQ(kKeptScratchBlocks, 4);
    EXPECT_EQ(KeptScratchBytes(), bytes[0] + bytes[1] + bytes[2] + bytes[3]);
    blocks.clear();
    EXPECT_LT(KeptScratchBytes(), all);
  }).join();
}

}  // namespace
}  // namespace kimi
