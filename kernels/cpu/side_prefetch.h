// Side prefetch: memory that a coming memory-bound pass will read, fetched a few lines at a time
// from inside the compute-bound products that run just before it, so that its transfer overlaps
// their arithmetic instead of stalling the pass. The case it serves: in a batched decode step the
// KDA recurrence reads and writes every sequence's state (a k3-mini layer at batch 32: 8.8 MB) at
// the memory's speed, while the layer's projections, just before it, leave the memory idle. Lines
// go to L2 (hint T1) and spill into L3, where the pass finds them.
//
// Thread contract: SetSidePrefetch and ClearSidePrefetch from the thread that calls ParallelFor,
// between jobs. The products' loops over packed bf16 weight groups (AVX-512, fp32 activations:
// GroupStrips in matmul_avx512.cc; AMX's tile loop, TilesRange in matmul_amx.cc, a piece per pair
// of groups) running on thread i of the pool prefetch by_thread[i]'s ranges in order, a few lines
// a block of weights; the other kernels leave them. A prefetch never faults
// and changes no value.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {

using SideRanges = std::vector<ThreadPool::MemoryRange>;

// Replaces what is left to prefetch; entries past the pool's threads are ignored.
void SetSidePrefetch(std::span<const SideRanges> by_thread);
// Drops what is left.
void ClearSidePrefetch();

// For the kernels: the next piece of the calling thread's ranges, [p, end) in whole 64-byte lines;
// empty when its ranges are done.
struct SidePiece {
  const char* p = nullptr;
  const char* end = nullptr;
};
SidePiece ClaimSidePiece();

namespace side_prefetch_internal {
extern std::atomic<bool> active;
}  // namespace side_prefetch_internal
// Whether any ranges were set and not cleared (a relaxed read, once per product range).
inline bool SidePrefetchActive() {
  return side_prefetch_internal::active.load(std::memory_order_relaxed);
}

}  // namespace kimi::cpu
