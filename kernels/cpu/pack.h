// Weight packing: rows interleaved in groups so that a decode GEMV reads memory in one linear
// stream per thread (the hardware prefetcher's favourite pattern) instead of kPackRows short ones.
//
// Packed layout of a [rows, cols] matrix, rows % kPackRows == 0, cols % 32 == 0 (G = kPackRows):
//   bf16:  group g, block b (32 columns), row j < G:
//          element (g*G + j, 32b + i) at  g*G*cols + b*32*G + j*32 + i          (uint16 units)
//   MXFP4: codes of (g*G + j, block b) at  g*G*cols/2 + b*16*G + j*16           (16 bytes)
//          scale of (g*G + j, block b) at  g*G*cols/32 + b*G + j               (1 byte)
// A group fills exactly the bytes of its G rows in row-major order. Packing changes no value and no
// summation order (matmul_impl.h): results are bit-identical to the unpacked weight.
#pragma once

#include <cstdint>

#include "kernels/weight.h"

namespace kimi::cpu {

// True when `w` has a packed layout: bf16 or MXFP4, rows % kPackRows == 0, cols % 32 == 0.
bool CanPack(const Weight& w);

// Reorders w's bytes in place (data, and scales for MXFP4; both must be writable and be the
// memory w points to) and sets w->packed. A weight that cannot be packed is left as it is.
void PackInPlace(Weight* w);

}  // namespace kimi::cpu
