#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kimi::cpu {
namespace {

// 16 independent lanes, then a fixed pairwise reduction: vectorises without -ffast-math and keeps
// the summation order a function of K alone.
constexpr int kLanes = 16;

inline float ReduceLanes(float* acc) {
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

// E2M1 code -> value (sign bit 3, then exponent 2 bits, mantissa 1 bit).
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline float E8m0ToF32(uint8_t s) {
  // 2^(s-127); s = 255 is NaN in the OCP spec, s = 0 is 2^-127 (a subnormal in fp32).
  if (s == 255) return __builtin_nanf("");
  if (s == 0) return 5.877471754111438e-39f;
  uint32_t bits = static_cast<uint32_t>(s) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#define KIMI_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

KIMI_CLONES float DotF32(const float* x, const float* w, int64_t k) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * w[i + j];
  }
  for (int j = 0; i < k; ++i, ++j) acc[j] += x[i] * w[i];
  return ReduceLanes(acc);
}

KIMI_CLONES float DotBf16(const float* x, const uint16_t* w, int64_t k) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * Bf16ToF32(w[i + j]);
  }
  for (int j = 0; i < k; ++i, ++j) acc[j] += x[i] * Bf16ToF32(w[i]);
  return ReduceLanes(acc);
}

float DotF16(const float* x, const uint16_t* w, int64_t k) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * F16ToF32(w[i + j]);
  }
  for (int j = 0; i < k; ++i, ++j) acc[j] += x[i] * F16ToF32(w[i]);
  return ReduceLanes(acc);
}

// One 32-wide block at a time: the E2M1 products are exact multiples of 0.5, the block sum is
// scaled once by its power-of-two scale (exact), so only the additions round.
KIMI_CLONES float DotMxfp4(const float* x, const uint8_t* packed, const uint8_t* scales,
                           int64_t k) {
  float total[kLanes] = {};
  for (int64_t b = 0; b < k / 32; ++b) {
    float acc[kLanes] = {};
    const uint8_t* p = packed + b * 16;
    const float* xb = x + b * 32;
    for (int j = 0; j < 16; ++j) {
      acc[j] += xb[2 * j] * kE2m1[p[j] & 0xf] + xb[2 * j + 1] * kE2m1[p[j] >> 4];
    }
    const float s = E8m0ToF32(scales[b]);
    for (int j = 0; j < kLanes; ++j) total[j] += acc[j] * s;
  }
  return ReduceLanes(total);
}

float Dot(const float* x, const Weight& w, int64_t r) {
  const int64_t k = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      return DotF32(x, static_cast<const float*>(w.data) + r * k, k);
    case WeightFormat::kBF16:
      return DotBf16(x, static_cast<const uint16_t*>(w.data) + r * k, k);
    case WeightFormat::kF16:
      return DotF16(x, static_cast<const uint16_t*>(w.data) + r * k, k);
    case WeightFormat::kMxfp4:
      return DotMxfp4(x, static_cast<const uint8_t*>(w.data) + r * (k / 2), w.scales + r * (k / 32),
                      k);
  }
  return 0.0f;
}

}  // namespace

void MatMul(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w, int64_t m) {
  if (m <= 0 || w.rows <= 0) return;
  // Partition over output columns so each weight row is read from memory once per call.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, w.cols * m));
  ParallelFor(w.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t i = 0; i < m; ++i) y[i * ldy + n] = Dot(x + i * ldx, w, n);
    }
  });
}

void DequantizeRow(float* out, const Weight& w, int64_t r) {
  const int64_t k = w.cols;
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* src = static_cast<const float*>(w.data) + r * k;
      std::copy(src, src + k, out);
      return;
    }
    case WeightFormat::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * k;
      for (int64_t i = 0; i < k; ++i) out[i] = Bf16ToF32(src[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * k;
      for (int64_t i = 0; i < k; ++i) out[i] = F16ToF32(src[i]);
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (k / 2);
      const uint8_t* s = w.scales + r * (k / 32);
      for (int64_t i = 0; i < k; i += 2) {
        const float scale = E8m0ToF32(s[i / 32]);
        out[i] = kE2m1[p[i / 2] & 0xf] * scale;
        out[i + 1] = kE2m1[p[i / 2] >> 4] * scale;
      }
      return;
    }
  }
}

}  // namespace kimi::cpu
