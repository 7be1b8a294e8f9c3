// Elementwise activations, vectorised for AVX-512 and AVX2 with the same formulas (Cephes-style
// exp, log and tanh, ~1-2 ulp), chosen at run time like MatMul; the scalar fallback uses libm.
// Every element goes through the same vector code, tail included (masked or padded), so a value's
// result never depends on where it sits in the buffer (batch invariance).
//
// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/activation.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/matmul.h"

namespace kimi::cpu {
namespace {

enum class Op { kSilu, kSitu, kSigmoid, kSigmoidMul, kSoftplus };

struct Params {
  float beta = 4.0f, linear_beta = 25.0f;
  // 1 / beta where beta is a power of two (K3's 4): gate * inv_beta is then gate / beta to the
  // bit, without a division. 0 otherwise.
  float inv_beta = 0.0f;
};

// --- scalar -------------------------------------------------------------------------------------
float ScalarOne(Op op, float g, float u, const Params& p) {
  switch (op) {
    case Op::kSilu:
      return g * Sigmoid(g) * u;
    case Op::kSitu:
      return p.beta * std::tanh(g / p.beta) * Sigmoid(g) * (p.linear_beta * std::tanh(u / p.linear_beta));
    case Op::kSigmoid:
      return Sigmoid(g);
    case Op::kSigmoidMul:
      return u * Sigmoid(g);
    case Op::kSoftplus:
      return g > 20.0f ? g : std::log1p(std::exp(g));
  }
  return 0.0f;
}

void ScalarRun(Op op, float* out, const float* g, const float* u, int64_t n, const Params& p) {
  for (int64_t i = 0; i < n; ++i) out[i] = ScalarOne(op, g[i], u ? u[i] : 0.0f, p);
}

// Cephes expf / tanhf constants.
constexpr float kExpHi = 88.3762626647949f, kExpLo = -87.3365447505531f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
// Cephes logf: log(1 + x) = x - x^2 / 2 + x^3 L(x) on [sqrt(1/2) - 1, sqrt(2) - 1].
constexpr float kL0 = 7.0376836292e-2f, kL1 = -1.1514610310e-1f, kL2 = 1.1676998740e-1f,
                kL3 = -1.2420140846e-1f, kL4 = 1.4249322787e-1f, kL5 = -1.6668057665e-1f,
                kL6 = 2.0000714765e-1f, kL7 = -2.4999993993e-1f, kL8 = 3.3333331174e-1f;
constexpr float kSqrt2 = 1.41421356237f;
constexpr float kT0 = -5.70498872745e-3f, kT1 = 2.06390887954e-2f, kT2 = -5.37397155531e-2f,
                kT3 = 1.33314422036e-1f, kT4 = -3.33332819422e-1f;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")

// --- AVX-512 ------------------------------------------------------------------------------------
inline __m512 Exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __m512 Sigmoid512(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, Exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// The large branch (an exp and a division) only for vectors with a lane that needs it: a SiTU's
// up / linear_beta (|up| < 15.6) and most of its gate / beta (|gate| < 2.5) take the polynomial.
// Each lane gets the same branch either way (the same bits). SiTU-GLU over 2^20 normally
// distributed values on one thread, with the power-of-two beta below: 0.94-1.06 -> 0.57-0.73 ms.
inline __m512 Tanh512(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  // |x| < 0.625: x + x^3 P(x^2).
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(kT0);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(kT1));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(kT2));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(kT3));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(kT4));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  if (is_small == 0xffff) return small;
  // |x| >= 0.625: 1 - 2 / (exp(2|x|) + 1), with the sign of x.
  const __m512 e = Exp512(_mm512_add_ps(ax, ax));
  __m512 big =
      _mm512_sub_ps(_mm512_set1_ps(1.0f),
                    _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  big = _mm512_or_ps(big, _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));
  return _mm512_mask_blend_ps(is_small, big, small);
}

// log(x) for normal x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then Cephes' polynomial.
inline __m512 Log512(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  __m512 e =
      _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(127)));
  __m512 m = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x3f800000)));
  const __mmask16 high = _mm512_cmp_ps_mask(m, _mm512_set1_ps(kSqrt2), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, high, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, high, e, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(f, f);
  __m512 p = _mm512_set1_ps(kL0);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL7));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kL8));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, f), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(kLn2Lo), y);
  y = _mm512_fnmadd_ps(z, _mm512_set1_ps(0.5f), y);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(kLn2Hi), _mm512_add_ps(f, y));
}

// softplus(x) = max(x, 0) + log1p(exp(-|x|)), log1p(t) = log(1 + t) t / ((1 + t) - 1) (exact
// where 1 + t rounds to 1: then t). Above 20 this is x to the float, as torch's threshold gives.
inline __m512 Softplus512(__m512 x) {
  const __m512 t = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __m512 u = _mm512_add_ps(_mm512_set1_ps(1.0f), t);
  const __m512 d = _mm512_sub_ps(u, _mm512_set1_ps(1.0f));
  const __mmask16 rounded = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_EQ_OQ);
  const __m512 l = _mm512_mask_blend_ps(rounded, _mm512_mul_ps(Log512(u), _mm512_div_ps(t, d)), t);
  return _mm512_add_ps(_mm512_max_ps(x, _mm512_setzero_ps()), l);
}

inline __m512 Apply512(Op op, __m512 g, __m512 u, const Params& p) {
  switch (op) {
    case Op::kSilu:
      return _mm512_mul_ps(_mm512_mul_ps(g, Sigmoid512(g)), u);
    case Op::kSitu: {
      const __m512 b = _mm512_set1_ps(p.beta), lb = _mm512_set1_ps(p.linear_beta);
      const __m512 gb =
          p.inv_beta != 0.0f ? _mm512_mul_ps(g, _mm512_set1_ps(p.inv_beta)) : _mm512_div_ps(g, b);
      const __m512 a = _mm512_mul_ps(_mm512_mul_ps(b, Tanh512(gb)), Sigmoid512(g));
      return _mm512_mul_ps(a, _mm512_mul_ps(lb, Tanh512(_mm512_div_ps(u, lb))));
    }
    case Op::kSigmoid:
      return Sigmoid512(g);
    case Op::kSigmoidMul:
      return _mm512_mul_ps(u, Sigmoid512(g));
    case Op::kSoftplus:
      return Softplus512(g);
  }
  return g;
}

void Run512(Op op, float* out, const float* g, const float* u, int64_t n, const Params& p) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 uv = u ? _mm512_maskz_loadu_ps(m, u + i) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(out + i, m, Apply512(op, gv, uv, p));
  }
}

// --- AVX2 ---------------------------------------------------------------------------------------
#pragma GCC target("avx2,fma")

inline __m256 Exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n is in [-126, 128]: scale in two steps so 2^n never leaves the normal range.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

inline __m256 Sigmoid256(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, Exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

inline __m256 Tanh256(__m256 x) {  // as Tanh512
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(kT0);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(kT1));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(kT2));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(kT3));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(kT4));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 is_small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ);
  if (_mm256_movemask_ps(is_small) == 0xff) return small;
  const __m256 e = Exp256(_mm256_add_ps(ax, ax));
  __m256 big =
      _mm256_sub_ps(_mm256_set1_ps(1.0f),
                    _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  big = _mm256_or_ps(big, _mm256_and_ps(x, _mm256_set1_ps(-0.0f)));
  return _mm256_blendv_ps(big, small, is_small);
}

inline __m256 Log256(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  __m256 e =
      _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)), _mm256_set1_epi32(0x3f800000)));
  const __m256 high = _mm256_cmp_ps(m, _mm256_set1_ps(kSqrt2), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), high);
  e = _mm256_blendv_ps(e, _mm256_add_ps(e, _mm256_set1_ps(1.0f)), high);
  const __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f));
  const __m256 z = _mm256_mul_ps(f, f);
  __m256 p = _mm256_set1_ps(kL0);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL5));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL7));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kL8));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, f), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(kLn2Lo), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(kLn2Hi), _mm256_add_ps(f, y));
}

inline __m256 Softplus256(__m256 x) {
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 t = Exp256(_mm256_sub_ps(_mm256_setzero_ps(), ax));
  const __m256 u = _mm256_add_ps(_mm256_set1_ps(1.0f), t);
  const __m256 d = _mm256_sub_ps(u, _mm256_set1_ps(1.0f));
  const __m256 rounded = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_EQ_OQ);
  const __m256 l = _mm256_blendv_ps(_mm256_mul_ps(Log256(u), _mm256_div_ps(t, d)), t, rounded);
  return _mm256_add_ps(_mm256_max_ps(x, _mm256_setzero_ps()), l);
}

inline __m256 Apply256(Op op, __m256 g, __m256 u, const Params& p) {
  switch (op) {
    case Op::kSilu:
      return _mm256_mul_ps(_mm256_mul_ps(g, Sigmoid256(g)), u);
    case Op::kSitu: {
      const __m256 b = _mm256_set1_ps(p.beta), lb = _mm256_set1_ps(p.linear_beta);
      const __m256 gb =
          p.inv_beta != 0.0f ? _mm256_mul_ps(g, _mm256_set1_ps(p.inv_beta)) : _mm256_div_ps(g, b);
      const __m256 a = _mm256_mul_ps(_mm256_mul_ps(b, Tanh256(gb)), Sigmoid256(g));
      return _mm256_mul_ps(a, _mm256_mul_ps(lb, Tanh256(_mm256_div_ps(u, lb))));
    }
    case Op::kSigmoid:
      return Sigmoid256(g);
    case Op::kSigmoidMul:
      return _mm256_mul_ps(u, Sigmoid256(g));
    case Op::kSoftplus:
      return Softplus256(g);
  }
  return g;
}

void Run256(Op op, float* out, const float* g, const float* u, int64_t n, const Params& p) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 uv = u ? _mm256_loadu_ps(u + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(out + i, Apply256(op, _mm256_loadu_ps(g + i), uv, p));
  }
  if (i < n) {  // the tail through the same code, via zero-padded copies
    float gb[8] = {}, ub[8] = {}, ob[8];
    std::memcpy(gb, g + i, (n - i) * sizeof(float));
    if (u) std::memcpy(ub, u + i, (n - i) * sizeof(float));
    _mm256_storeu_ps(ob, Apply256(op, _mm256_loadu_ps(gb), _mm256_loadu_ps(ub), p));
    std::memcpy(out + i, ob, (n - i) * sizeof(float));
  }
}

#pragma GCC pop_options

void Run(Op op, float* out, const float* g, const float* u, int64_t n, const Params& p = {}) {
  // Same instruction set as MatMul (so $KIMI_ISA and SetMatMulIsa cover both).
  switch (MatMulIsa()) {
    case Isa::kAmx:
    case Isa::kAvx512:
      return Run512(op, out, g, u, n, p);
    case Isa::kAvx2:
      return Run256(op, out, g, u, n, p);
    case Isa::kScalar:
      break;
  }
  ScalarRun(op, out, g, u, n, p);
}

}  // namespace

void SiluGlu(float* out, const float* gate, const float* up, int64_t n) {
  Run(Op::kSilu, out, gate, up, n);
}

void SituGlu(float* out, const float* gate, const float* up, int64_t n, float beta,
             float linear_beta) {
  // x * 2^-e and x / 2^e are the same correctly rounded value (also below the normal range), as
  // long as 2^-e itself is a normal float.
  int e = 0;
  const bool pow2 = std::frexp(beta, &e) == 0.5f && e > -125 && e < 127;
  Run(Op::kSitu, out, gate, up, n, Params{beta, linear_beta, pow2 ? 1.0f / beta : 0.0f});
}

void SigmoidInPlace(float* x, int64_t n) { Run(Op::kSigmoid, x, x, nullptr, n); }

void SoftplusInPlace(float* x, int64_t n) { Run(Op::kSoftplus, x, x, nullptr, n); }

void MulSigmoid(float* x, const float* gate, int64_t n) {
  Run(Op::kSigmoidMul, x, gate, x, n);
}

void SiluGluRows(float* out, const float* gate_up, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    SiluGlu(out + r * width, gate_up + r * 2 * width, gate_up + r * 2 * width + width, width);
  }
}

void SituGluRows(float* out, const float* gate_up, int64_t rows, int64_t width, float beta,
                 float linear_beta) {
  for (int64_t r = 0; r < rows; ++r) {
    SituGlu(out + r * width, gate_up + r * 2 * width, gate_up + r * 2 * width + width, width, beta,
            linear_beta);
  }
}

}  // namespace kimi::cpu
