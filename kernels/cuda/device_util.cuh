// Private to kernels/cuda/*.cu: device helpers shared by the kernels (reductions, number formats).
// Host code never includes this file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/weight.h"

namespace kimi::cuda::dev {

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of `v` over the block, returned to every thread. blockDim.x must be a multiple of 32 (at
// most 1024); the order of additions depends only on blockDim.x, so a row's result never depends
// on which block or launch computes it. `scratch` holds 32 floats; the call synchronises twice.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(t);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(t);
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float Bf16ToF32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ float F16ToF32(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// OCP E2M1: sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and negatives).
__device__ __forceinline__ float E2m1ToF32(uint32_t code) {
  const uint32_t m = code & 7u, e = m >> 1, f = m & 1u;
  const float mag = e == 0 ? 0.5f * static_cast<float>(f)
                           : (1.0f + 0.5f * static_cast<float>(f)) * static_cast<float>(1u << (e - 1));
  return (code & 8u) ? -mag : mag;
}

// E8M0 scale 2^(s - 127); s = 255 is NaN, s = 0 is 2^-127 (subnormal), as on the CPU.
__device__ __forceinline__ float E8m0ToF32(uint32_t s) {
  if (s == 255u) return __uint_as_float(0x7fc00000u);
  if (s == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(s << 23);
}

// Element (r, i) of a row-major (not packed) weight in device memory, as fp32.
__device__ __forceinline__ float WeightAt(const void* data, const uint8_t* scales, WeightFormat f,
                                          int64_t cols, int64_t r, int64_t i) {
  switch (f) {
    case WeightFormat::kF32:
      return static_cast<const float*>(data)[r * cols + i];
    case WeightFormat::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(data)[r * cols + i]);
    case WeightFormat::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[r * cols + i]);
    case WeightFormat::kMxfp4: {
      const uint8_t byte = static_cast<const uint8_t*>(data)[r * (cols / 2) + i / 2];
      return E2m1ToF32((i & 1) ? byte >> 4 : byte & 0xfu) * E8m0ToF32(scales[r * (cols / 32) + i / 32]);
    }
  }
  return 0.0f;
}

// Blocks of `threads` covering n items, capped for grid-stride loops.
inline unsigned GridFor(int64_t n, int threads, int64_t cap = 65535) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

}  // namespace kimi::cuda::dev

namespace kimi::cuda::dev {

// KDA log-decay of one channel from z = g_raw + dt_bias (kernels/cpu/kda.h KdaGate):
//   lower bound (K3): lb * sigmoid(exp(A_log) z);  none (Kimi Linear): -exp(A_log) softplus(z)
__device__ __forceinline__ float KdaDecay(float z, float a_log, bool has_lb, float lb) {
  const float a = expf(a_log);
  if (has_lb) return lb * Sigmoid(a * z);
  const float softplus = z > 20.0f ? z : log1pf(expf(z));
  return -a * softplus;
}

}  // namespace kimi::cuda::dev
