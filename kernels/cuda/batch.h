// The shape of one step's batch on the device: plain index arrays built once per step on the host
// and read by every layer's kernels (flashinfer-style page tables), so a captured CUDA graph can
// be replayed with new contents at the same addresses. Sequence s owns token rows
// [seq_offset[s], seq_offset[s] + seq_count[s]) of the step's [T, ...] buffers.
#pragma once

#include <cstdint>

namespace kimi::cuda {

struct DeviceBatch {
  // Per sequence, [num_seqs]. A padding entry (CUDA-graph buckets) has slot -1 and no pages; the
  // kernels treat it as a no-op (zero outputs, no state touched).
  const int32_t* seq_offset = nullptr;
  const int32_t* seq_count = nullptr;
  const int32_t* seq_pos0 = nullptr;        // tokens already folded into the state
  const int32_t* seq_slot = nullptr;        // KDA state slot, -1: padding
  const int32_t* seq_page_start = nullptr;  // first entry of the sequence's page table in `pages`
  const int32_t* pages = nullptr;           // all page tables, concatenated
  // Per token, [num_tokens]: its sequence (-1: padding) and absolute position.
  const int32_t* tok_seq = nullptr;
  const int32_t* tok_pos = nullptr;
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
};

}  // namespace kimi::cuda
