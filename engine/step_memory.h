// The memory a step's layers allocate and free: the heap policy (process-wide) and the layers'
// scratch buffers (see step_memory.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kimi {

// glibc's largest mmap threshold on 64-bit hosts: KeepStepMemory sets it, so blocks below it come
// from the heap and blocks from it on are mapped (and unmapped when freed) by glibc.
inline constexpr int64_t kHeapBlockLimit = int64_t{32} << 20;

// Keeps the memory a step frees for the next one instead of handing it back to the OS: blocks of
// up to kHeapBlockLimit come from the heap, and free memory at the top of the heap is returned only
// beyond 1 GiB. Idempotent; every Engine calls it when constructed. No effect outside glibc.
void KeepStepMemory();

// A step's scratch of n floats, not zero-filled: for buffers whose every element is written before
// it is read (zero fills of the layers' activations were 2-3% of a batch-64 step). Blocks too
// large for the heap (a full-size K3 layer's routed-expert rows at a 512-token chunk are 117 MB
// each) are kept when freed, at most kKeptScratchBlocks per thread, and handed out again.
struct ScratchFree {
  size_t bytes = 0;  // the block's capacity
  void operator()(float* p) const noexcept;
};
using ScratchBuffer = std::unique_ptr<float[], ScratchFree>;
ScratchBuffer Scratch(int64_t n);

inline constexpr int kKeptScratchBlocks = 4;
// Bytes of large blocks the calling thread keeps for reuse (for tests).
int64_t KeptScratchBytes();

}  // namespace kimi
