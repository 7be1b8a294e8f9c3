// Prefetching the next product's weights while the pool's threads wait.
//
// A decode step runs the same matrix products in the same order for every token, with serial work
// on the calling thread between them (norms, gates, routing, the attention residuals) while the
// workers wait. A product split into shares (RunInShares) looks up which product followed it last
// time and asks the threads to prefetch the start of their shares of that one while they wait
// (ThreadPool::SetIdleHints).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu::matmul_internal {

// Which product followed which: products are named by a key (their first weight's data), each
// with the start of every thread's share.
class ProductSequence {
 public:
  using Shares = std::span<const ThreadPool::MemoryRange>;

  // Records `shares` as what followed the previous product noted (unless that was `key` too), and
  // returns the shares of the product that followed `key` the last time (empty the first time).
  // The result stays valid until the next call.
  Shares Note(const void* key, Shares shares);

  // A model has a few hundred products; keys of unloaded models only take room (a stale hint
  // prefetches memory no one reads: a prefetch never faults), so the table is cleared when it
  // reaches this size.
  static constexpr size_t kMaxProducts = size_t{1} << 14;

 private:
  std::unordered_map<const void*, std::vector<ThreadPool::MemoryRange>> next_;
  const void* last_ = nullptr;
};

// From the pool's calling thread, at the start of a product split into shares.size() shares:
// notes it in a process-wide ProductSequence and hints the pool with the shares of the product
// that followed `key` last time.
void HintNextProduct(ThreadPool& pool, const void* key, ProductSequence::Shares shares);

}  // namespace kimi::cpu::matmul_internal
