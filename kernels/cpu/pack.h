// Weight packing: each group of kPackRows rows reordered so that a kernel reads one linear stream
// per group (the hardware prefetcher's favourite pattern) instead of kPackRows short ones. Two
// layouts of a [rows, cols] matrix, rows % kPackRows == 0, cols % 32 == 0 (G = kPackRows, nb =
// cols / 32 blocks of 32 columns; canonical lane J = 0..15 of a block holds its columns 2J, 2J + 1,
// matmul_impl.h):
//
// kBlocks, for dot products (AVX-512): block after block, the G rows' 32 elements each.
//   bf16:  element (g*G + j, 32b + i) at  g*G*cols + (b*G + j)*32 + i                (uint16 units)
//   MXFP4: codes of (g*G + j, block b) at  g*G*cols/2 + (b*G + j)*16                 (16 bytes)
// kLanes, for outer products (AVX2: a vector holds one lane of the G rows): lane after lane, block
// after block, the G rows' pair of that lane.
//   bf16:  element (g*G + j, 32b + 2J + q) at  g*G*cols + ((J*nb + b)*G + j)*2 + q   (uint16 units)
//   MXFP4: code byte of (g*G + j, 32b + 2J) at  g*G*cols/2 + (J*nb + b)*G + j        (1 byte)
// Both: MXFP4 scale of (g*G + j, block b) at  g*G*nb + b*G + j                       (1 byte)
//
// A group fills exactly the bytes of its G rows in row-major order. Packing changes no value and no
// summation order (matmul_impl.h): results are bit-identical to the unpacked weight.
#pragma once

#include <cstdint>

#include "kernels/weight.h"

namespace kimi::cpu {

enum class PackLayout { kBlocks, kLanes };

// The layout this machine's MatMul kernels read fastest for `format`: kLanes for bf16 where they
// are AVX2's, kBlocks otherwise (AVX-512's dot products; MXFP4, whose per-row scale the blocks
// layout folds into the decode table once per block and row). Every kernel reads both layouts.
PackLayout PreferredPackLayout(WeightFormat format);

// True when `w` can be packed: bf16 or MXFP4, unpacked, rows % kPackRows == 0, cols % 32 == 0.
bool CanPack(const Weight& w);

// Reorders w's bytes in place (data, and scales for MXFP4; both must be writable and be the
// memory w points to) and sets w->packed (and w->lane_major). A weight that cannot be packed is
// left as it is.
void PackInPlace(Weight* w, PackLayout layout);
inline void PackInPlace(Weight* w) { PackInPlace(w, PreferredPackLayout(w->format)); }

// The row-major bytes of w, packed or not: data [rows * cols * element size, or rows * cols / 2
// for MXFP4] and, for MXFP4, scales [rows * cols / 32] (else `scales` is untouched).
void CopyRowMajor(const Weight& w, uint8_t* data, uint8_t* scales);

}  // namespace kimi::cpu
