#include "engine/step_memory.h"

#include <mutex>
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
// threshold glibc accepts on 64-bit hosts; larger blocks are still mapped per call. The cost is
// resident memory: the process keeps the peak of what it freed instead of returning it.
void KeepStepMemory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

}  // namespace kimi
