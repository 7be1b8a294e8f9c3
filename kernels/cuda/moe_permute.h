// Token permutation for the grouped expert GEMM, with static shapes (no host synchronisation, so
// a decode step stays graph-capturable):
//   MoePermute  sorts the step's (token, choice) pairs by expert (stable: token order within an
//               expert) and cuts each expert's rows into tiles of `tile_rows`;
//   MoeCombine  adds each token's expert outputs back, weighted, in ascending expert id (the
//               order kernels/cpu's MoE uses), so a token's result depends only on its own routing.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// Device arrays written by MoePermute.
struct MoePlan {
  int32_t* expert_offset = nullptr;  // [E + 1] first sorted row of each expert
  int32_t* sorted_token = nullptr;   // [T * k] token of each sorted row
  int32_t* row_of = nullptr;         // [T * k] sorted row of choice (t, j)
  int32_t* tile_group = nullptr;     // [max tiles] expert of each tile
  int32_t* tile_row0 = nullptr;      // [max tiles] first row of each tile
  int32_t* tile_row_end = nullptr;   // [max tiles] end of the tile's expert's rows
  int32_t* num_tiles = nullptr;      // [1]
};

// Upper bound on the tiles of T tokens routed to k of E experts.
inline int64_t MoeMaxTiles(int64_t T, int64_t k, int64_t E, int64_t tile_rows) {
  const int64_t n = T * k;
  return (n + tile_rows - 1) / tile_rows + (E < n ? E : n);
}

// ids [T, k] (values in [0, E)).
absl::Status MoePermute(const MoePlan& plan, const int32_t* ids, int64_t T, int64_t k, int64_t E,
                        int64_t tile_rows, cudaStream_t stream);

// out[t, :D] = sum over j, in ascending ids[t, j], of weights[t, j] * rows[row_of[t, j], :D].
absl::Status MoeCombine(float* out, const float* rows, const int32_t* ids, const float* weights,
                        const int32_t* row_of, int64_t T, int64_t k, int64_t D, cudaStream_t stream);

}  // namespace kimi::cuda
