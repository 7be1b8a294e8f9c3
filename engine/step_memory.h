// The heap policy for a step's scratch memory (process-wide; see step_memory.cc).
#pragma once

namespace kimi {

// Keeps the memory a step frees for the next one instead of handing it back to the OS: blocks of
// up to 32 MiB come from the heap, and free memory at the top of the heap is returned only beyond
// 1 GiB. Idempotent; every Engine calls it when constructed. No effect outside glibc.
void KeepStepMemory();

}  // namespace kimi
