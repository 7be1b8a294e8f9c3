// Buffers that start on a cache line. The kernels read weights and activations in 64-byte blocks,
// and malloc aligns to 16 bytes only: a block 16 bytes past a line touches two (32 x rows against
// a 100512 x 512 bf16 weight, 2 threads, ran at 273-287 GFLOP/s from such a buffer and at 318-324
// from an aligned one).
#pragma once

#include <cstdint>
#include <vector>

namespace kimi::cpu {

// The first n elements of v from a 64-byte boundary (v grown as needed; its contents are kept only
// while the boundary does not move, so fill the buffer after the call).
template <class T>
T* CacheLineAligned(std::vector<T>& v, int64_t n) {
  constexpr int64_t kSlack = 64 / sizeof(T);
  if (static_cast<int64_t>(v.size()) < n + kSlack) v.resize(n + kSlack);
  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t{63});
}

}  // namespace kimi::cpu
