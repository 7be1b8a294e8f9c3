#include "engine/step_memory.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kimi {

// A step allocates each layer's buffers (projections, gathered expert rows, KDA chunk scratch) and
// frees them when the layer ends; the next layer allocates them again. glibc's defaults map blocks
// above a self-adjusting threshold afresh and hand free memory at the top of the heap back to the
// OS once it passes twice that threshold, so at prefill sizes every layer page-faulted and zeroed
// its buffers anew. On the paravirtualised Zen 5 host, where a fault is expensive, a 512-token
// k3-mini prefill took 1.42-1.56 s that way and 0.50-0.56 s with the memory kept; 64-token
// prefills and decode steps were level (benchmarks/README.md). 32 MiB is the largest mmap
// threshold glibc accepts on 64-bit hosts; larger blocks are kept by Scratch below. The cost is
// resident memory: the process keeps the peak of what it freed instead of returning it.
void KeepStepMemory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, kHeapBlockLimit);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

namespace {

// From this size on, malloc's own overhead included, glibc maps a block.
constexpr size_t kKeepFrom = kHeapBlockLimit - 4096;

// The large blocks this thread freed, for its next ones. A k3-mini prompt of 4096 tokens in one
// step (32 MiB of routed-expert rows a layer) took 5.7-6.9 s and 202k page faults with each block
// mapped afresh, 4.4-4.8 s and 5-11k with them kept (benchmarks/README.md).
struct KeptBlocks {
  std::vector<std::pair<size_t, float*>> blocks;  // capacity in bytes, block
  bool alive = true;                              // false once the thread's destructors have run
  // Reserved up front: the deleter, which cannot throw, never grows the vector.
  KeptBlocks() { blocks.reserve(kKeptScratchBlocks); }
  ~KeptBlocks() {
    for (const auto& b : blocks) delete[] b.second;
    blocks.clear();
    alive = false;
  }
};
thread_local KeptBlocks kept;

}  // namespace

ScratchBuffer Scratch(int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (bytes >= kKeepFrom && kept.alive) {
    // The smallest kept block that holds n floats.
    auto best = kept.blocks.end();
    for (auto it = kept.blocks.begin(); it != kept.blocks.end(); ++it) {
      if (it->first >= bytes && (best == kept.blocks.end() || it->first < best->first)) best = it;
    }
    if (best != kept.blocks.end()) {
      const auto [capacity, block] = *best;
      kept.blocks.erase(best);
      return ScratchBuffer(block, ScratchFree{capacity});
    }
  }
  return ScratchBuffer(new float[static_cast<size_t>(n)], ScratchFree{bytes});
}

void ScratchFree::operator()(float* p) const noexcept {
  if (bytes >= kKeepFrom && kept.alive) {
    if (kept.blocks.size() < static_cast<size_t>(kKeptScratchBlocks)) {
      kept.blocks.emplace_back(bytes, p);
      return;
    }
    // Full: keep the larger blocks (a larger one serves every request a smaller one does).
    auto smallest = std::min_element(kept.blocks.begin(), kept.blocks.end());
    if (smallest->first < bytes) {
      std::swap(p, smallest->second);
      smallest->first = bytes;
    }
  }
  delete[] p;
}

int64_t KeptScratchBytes() {
  int64_t total = 0;
  for (const auto& b : kept.blocks) total += static_cast<int64_t>(b.first);
  return total;
}

}  // namespace kimi
