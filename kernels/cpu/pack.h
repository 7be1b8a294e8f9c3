// Weight packing: each group of G rows reordered so that a kernel reads one linear stream per
// group (the hardware prefetcher's favourite pattern) instead of G short ones. Four layouts
// (kimi::PackLayout, kernels/weight.h) of a [rows, cols] matrix, rows % G == 0, cols % 32 == 0
// (G = PackGroupRows(layout): kPackRows = 8, kTileRows = 16 for kTiles; nb = cols / 32 blocks of
// 32 columns; canonical lane J = 0..15 of a block holds its columns 2J, 2J + 1, matmul_impl.h):
//
// kBlocks, for dot products (AVX-512): block after block, the G rows' 32 elements each.
//   bf16:  element (g*G + j, 32b + i) at  g*G*cols + (b*G + j)*32 + i                (uint16 units)
//   MXFP4: codes of (g*G + j, block b) at  g*G*cols/2 + (b*G + j)*16                 (16 bytes)
// kLanes, for outer products (AVX2: a vector holds one lane of the G rows): lane after lane, block
// after block, the G rows' pair of that lane.
//   bf16:  element (g*G + j, 32b + 2J + q) at  g*G*cols + ((J*nb + b)*G + j)*2 + q   (uint16 units)
//   MXFP4: code byte of (g*G + j, 32b + 2J) at  g*G*cols/2 + (J*nb + b)*G + j        (1 byte)
// kPairs, MXFP4 only, for AVX2's byte-shuffle decode: block after block, G/2 runs of 32 bytes; run
//   p holds rows 2p (low nibbles) and 2p + 1 (high nibbles), each row's 32 codes in the order the
//   decode's in-lane unpacks produce canonical lanes (PairsCodeByte below).
// kTiles, groups of G = kTileRows (16) rows, for AMX (matmul_amx.cc): block after block, the block
//   transposed by pairs, one tile: lane after lane, the G rows' pair of that lane.
//   bf16:  element (g*G + j, 32b + 2J + q) at  g*G*cols + ((b*16 + J)*G + j)*2 + q   (uint16 units)
//   MXFP4: a block's 512 codes in 256 bytes, four lanes to a 64-byte chunk (TilesCodeNibble);
//   only when the scale of every block with a nonzero code is in [kTilesMinScale, kTilesMaxScale]
//   and no scale is NaN (255).
// All: MXFP4 scale of (g*G + j, block b) at   g*G*nb + b*G + j                      (1 byte)
//
// A group fills exactly the bytes of its G rows in row-major order. Packing changes no value and no
// summation order (matmul_impl.h): results are bit-identical to the unpacked weight.
#pragma once

#include <cstdint>

#include "kernels/weight.h"

namespace kimi::cpu {

// kPairs: the byte, from the start of its group, holding the code of element i (0..31) of block b
// of row j (0..G-1) of the group; the low nibble for even j. Element i is canonical lane
// L = (i % 16) / 2, parity q = i % 2, of half h = i / 16: the decode turns 32 bytes into the
// vectors (h, q) = (0, 0), (0, 1), (1, 0), (1, 1) of each row, lanes 0..3 from bytes 0..15 and
// lanes 4..7 from bytes 16..31 (AVX2 shuffles stay within 128-bit halves).
constexpr int64_t PairsCodeByte(int64_t j, int64_t b, int64_t i) {
  const int64_t h = i / 16, q = i % 2, lane = (i % 16) / 2;
  return (b * (kPackRows / 2) + j / 2) * 32 + 8 * h + q + 2 * (lane % 4) + 16 * (lane / 4);
}

// kTiles MXFP4: the byte (from the start of its group) holding the code of element i (0..31) of
// block b of row j (0..15), and the nibble's shift in it (0 or 4). Lane J = i / 2 of the block is
// a tile row of 32 codes (row j's pair at words 2j, 2j + 1 of a 64-byte chunk); lanes 4q .. 4q + 3
// share chunk q, lane J in bits 4 (J % 4) .. 4 (J % 4) + 3 of every 16-bit word, so one load and
// three shifts give the codes of four tile rows, each word's low bits the index of its own.
struct CodeNibble {
  int64_t byte;
  int shift;
};
constexpr CodeNibble TilesCodeNibble(int64_t j, int64_t b, int64_t i) {
  const int64_t lane = i / 2, word = 2 * j + i % 2;
  return {b * 256 + (lane / 4) * 64 + word * 2 + (lane % 4) / 2, static_cast<int>(4 * (lane % 2))};
}

// The scales an MXFP4 weight needs for kTiles: the AMX kernels scale a block's codes by adding
// s - 127 to their bf16 exponents, exact while E2M1 x 2^(s - 127) stays a normal bf16 (0.5 x 2^-125
// up to 6 x 2^125); the tile unit would read a subnormal as zero.
inline constexpr int kTilesMinScale = 2, kTilesMaxScale = 252;

// The layout this machine's MatMul kernels read fastest for `format`. On AVX2 machines: kLanes for
// bf16, kPairs for MXFP4. On AVX-512 ones (their dot products) and scalar ones: kBlocks. With AMX:
// kTiles. Every instruction set reads every layout (kTiles outside AMX through the scalar
// fallback: only tests switch the instruction set after packing).
PackLayout PreferredPackLayout(WeightFormat format);

// True when `w` can be packed as `layout`: bf16 or MXFP4 as LayoutFits says, unpacked,
// rows % PackGroupRows(layout) == 0, cols % 32 == 0 (MXFP4 as kTiles: and the scales as the
// layout's description above says).
bool CanPack(const Weight& w, PackLayout layout);
inline bool CanPack(const Weight& w) { return CanPack(w, PreferredPackLayout(w.format)); }
// True when `layout` applies to `format` (kPairs: MXFP4 only).
bool LayoutFits(PackLayout layout, WeightFormat format);

// Reorders w's bytes in place (data, and scales for MXFP4; both must be writable and be the
// memory w points to) and sets w->packed and w->layout. A weight that cannot be packed is
// left as it is, and so is one whose format `layout` does not fit.
void PackInPlace(Weight* w, PackLayout layout);
inline void PackInPlace(Weight* w) { PackInPlace(w, PreferredPackLayout(w->format)); }

// The row-major bytes of w, packed or not: data [rows * cols * element size, or rows * cols / 2
// for MXFP4] and, for MXFP4, scales [rows * cols / 32] (else `scales` is untouched).
void CopyRowMajor(const Weight& w, uint8_t* data, uint8_t* scales);

}  // namespace kimi::cpu
