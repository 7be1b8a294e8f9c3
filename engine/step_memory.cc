#include "engine/step_memory.h"

#include <algorithm>
#include <mutex>
#include <new>
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

// Each block starts with a header holding its capacity in bytes; the floats follow with
// operator new's alignment (16 bytes, as make_unique gave them before).
constexpr size_t kHeader = 16;
// From this payload size on, header and malloc's own overhead included, glibc maps the block.
constexpr size_t kKeepFrom = kHeapBlockLimit - 4096;

// The large blocks this thread freed, for its next ones. A k3-mini prompt of 4096 tokens in one
// step (32 MiB of routed-expert rows a layer) took 5.5-6.0 s and 202k page faults with each
// block mapped afresh; see benchmarks/README.md for the figures with them kept.
struct KeptBlocks {
  std::vector<std::pair<size_t, void*>> blocks;  // capacity, block
  bool alive = true;                             // false once the thread's destructors have run
  ~KeptBlocks() {
    for (const auto& b : blocks) ::operator delete(b.second);
    blocks.clear();
    alive = false;
  }
};
thread_local KeptBlocks kept;

float* Payload(void* block) {
  return reinterpret_cast<float*>(static_cast<char*>(block) + kHeader);
}

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
      void* block = best->second;
      kept.blocks.erase(best);
      return ScratchBuffer(Payload(block));
    }
  }
  void* block = ::operator new(kHeader + bytes);
  *static_cast<size_t*>(block) = bytes;
  return ScratchBuffer(Payload(block));
}

void ScratchFree::operator()(float* p) const noexcept {
  void* block = reinterpret_cast<char*>(p) - kHeader;
  const size_t bytes = *static_cast<size_t*>(block);
  if (bytes >= kKeepFrom && kept.alive) {
    if (kept.blocks.size() < static_cast<size_t>(kKeptScratchBlocks)) {
      kept.blocks.emplace_back(bytes, block);
      return;
    }
    // Full: keep the larger blocks (a larger one serves every request a smaller one does).
    auto smallest = std::min_element(kept.blocks.begin(), kept.blocks.end());
    if (smallest->first < bytes) {
      std::swap(block, smallest->second);
      smallest->first = bytes;
    }
  }
  ::operator delete(block);
}

int64_t KeptScratchBytes() {
  int64_t total = 0;
  for (const auto& b : kept.blocks) total += static_cast<int64_t>(b.first);
  return total;
}

}  // namespace kimi
