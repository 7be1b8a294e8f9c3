#include "kernels/cpu/side_prefetch.h"

#include <algorithm>

namespace kimi::cpu {
namespace {

constexpr int64_t kLine = 64;
// A piece is claimed per weight group at most (GroupStrips; AMX's tile loop per pair of groups and
// x tiles), so it must outlast one: a group of a k3-mini projection at 32 x rows takes 11 strips
// of 16 blocks, 176 block visits (AMX: 128 blocks at 4 lines, K = 4096; past that a pair's later
// blocks take none).
constexpr int64_t kPieceBytes = 32 << 10;

// One thread's ranges and how far it got; touched by that thread during jobs and by the caller
// between them.
struct alignas(64) ThreadRanges {
  std::vector<ThreadPool::MemoryRange> ranges;  // whole lines
  size_t next = 0;                              // the range being handed out
  int64_t done = 0;                             // its bytes handed out
};

std::vector<ThreadRanges>& Threads() {
  static std::vector<ThreadRanges> threads;
  return threads;
}

}  // namespace

namespace side_prefetch_internal {
std::atomic<bool> active{false};
}  // namespace side_prefetch_internal

void SetSidePrefetch(std::span<const SideRanges> by_thread) {
  std::vector<ThreadRanges>& threads = Threads();
  threads.resize(std::max(threads.size(), by_thread.size()));
  bool any = false;
  for (size_t t = 0; t < threads.size(); ++t) {
    ThreadRanges& r = threads[t];
    r.ranges.clear();
    r.next = 0;
    r.done = 0;
    if (t >= by_thread.size()) continue;
    for (const ThreadPool::MemoryRange& m : by_thread[t]) {
      if (m.bytes <= 0) continue;
      // From the line holding the first byte to the one holding the last.
      const auto begin = reinterpret_cast<uintptr_t>(m.begin) & ~uintptr_t{kLine - 1};
      const auto end =
          (reinterpret_cast<uintptr_t>(m.begin) + m.bytes + kLine - 1) & ~uintptr_t{kLine - 1};
      r.ranges.push_back({reinterpret_cast<const void*>(begin), static_cast<int64_t>(end - begin)});
      any = true;
    }
  }
  side_prefetch_internal::active.store(any, std::memory_order_relaxed);
}

void ClearSidePrefetch() {
  if (SidePrefetchActive()) SetSidePrefetch({});  // every KDA layer calls it, mostly with none set
}

SidePiece ClaimSidePiece() {
  std::vector<ThreadRanges>& threads = Threads();
  const size_t t = static_cast<size_t>(ThreadPool::ThreadIndex());
  if (t >= threads.size()) return {};
  ThreadRanges& r = threads[t];
  while (r.next < r.ranges.size() && r.done == r.ranges[r.next].bytes) {
    ++r.next;
    r.done = 0;
  }
  if (r.next == r.ranges.size()) return {};
  const ThreadPool::MemoryRange& m = r.ranges[r.next];
  const int64_t take = std::min(kPieceBytes, m.bytes - r.done);
  const char* p = static_cast<const char*>(m.begin) + r.done;
  r.done += take;
  return {p, p + take};
}

}  // namespace kimi::cpu
