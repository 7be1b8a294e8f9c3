#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include <immintrin.h>

namespace kimi::cpu {
namespace {

// Row pointers into token-major [T, H, X] tensors.
inline const float* At(const float* base, int64_t t, int64_t h, int64_t H, int64_t X) {
  return base + (t * H + h) * X;
}

// exp over an array of log decays and their sums (every exponent here is <= 0), written so that
// the compiler vectorises it: Cephes expf (exp_poly.h, ~1 ulp), inputs clamped below at -87.34.
KIMI_INLINE void ExpNonPositiveArray(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ExpNonPositive(x[i]);
}

// Token t's rows of head h in the recurrence's inputs.
struct TokenRows {
  const float *q, *k, *v, *g;
  float beta;
  TokenRows(const float* q_, const float* k_, const float* v_, const float* g_, const float* beta_,
            int64_t t, int64_t h, int64_t H, int64_t K, int64_t V)
      : q(At(q_, t, h, H, K)),
        k(At(k_, t, h, H, K)),
        v(At(v_, t, h, H, V)),
        g(At(g_, t, h, H, K)),
        beta(beta_[t * H + h]) {}
};

// 16 floats as one value: a 512-bit register in the x86-64-v4 clone, pairs or quads of narrower
// ones in the others (lanes.h; the vector code below is all inlined into its builds, so GCC's ABI
// note on vector arguments does not apply).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef LaneVec<16>::V Vec16;

// What a state entry becomes when stored as bf16: the nearest even, a NaN kept a quiet NaN, and an
// fp32 subnormal flushed to the zero of its sign, as AVX-512 BF16's conversion (VCVTNEPS2BF16)
// does, so that every path rounds alike (entries under 1.2e-38 carry nothing a token would see).
inline uint16_t StateToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  float flushed;
  std::memcpy(&flushed, &bits, sizeof flushed);
  return F32ToBf16(flushed);
}

// 16 bf16 state entries widened to fp32 (exact), and 16 rounded as StateToBf16: GCC vectors for
// each clone (GenericBf16) or, on machines with AVX-512 BF16, its conversion (NativeBf16, below).
typedef uint32_t Bits16 __attribute__((vector_size(64)));
typedef uint16_t Half16 __attribute__((vector_size(32)));
struct GenericBf16 {
  static KIMI_INLINE Vec16 Load(const uint16_t* p) {
    Half16 h;
    std::memcpy(&h, p, sizeof h);
    const Bits16 bits = __builtin_convertvector(h, Bits16) << 16;
    Vec16 v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  static KIMI_INLINE void Store(uint16_t* p, Vec16 v) {
    Bits16 bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits = (bits & 0x7f800000u) == 0 ? bits & 0x80000000u : bits;
    const Bits16 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const Bits16 quiet_nan = (bits >> 16) | 0x40u;
    const Bits16 out = (bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    const Half16 h = __builtin_convertvector(out, Half16);
    std::memcpy(p, &h, sizeof h);
  }
};

// 16 fp32 state entries as they are: the fp32 state's load and store for RecurrentHeadFixed.
struct F32State {
  static KIMI_INLINE Vec16 Load(const float* p) {
    Vec16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static KIMI_INLINE void Store(float* p, Vec16 v) { std::memcpy(p, &v, sizeof v); }
};

// RecurrentHead for K = V = 128 (every Kimi checkpoint's head_dim), over a state of entries T that
// State loads as fp32 and stores (F32State; GenericBf16 or NativeBf16 for a bf16 state, rounding as
// it stores). kv, u and out live in registers across the rows of S, where the general loop loads
// and stores them once per row (twice the memory operations of the state itself). Each row is
// read in both passes and written once: the first pass keeps only kv, the second decays the row
// again (the same product) and adds the update, which is written first so that GCC, which forms
// FMAs from the first product in statement order whose one use is an add, fuses it and not the
// decayed row, as in the general loop's `row[j] += ki * u[j]` on the stored decayed row. So the
// same operations on every element, in the same order, as the general loop (the same bits; for a
// bf16 state, those of the fp32 step on the widened state, then rounded). exp(g) of a token's row
// is taken in one vectorised pass (ExpNonPositiveArray) before the rows: a libm call per row,
// between the row's loads and stores, made this loop save and restore its accumulators around
// every call. (The fp32 form stored the decayed row in its first pass too until `5a23b21`;
// without that store batch-32 steps took 2-3% less, the same bits: benchmarks/README.md, seventh
// AMX session.)
//
// With `next` (the next head's state, from KdaRecurrent over a bf16 state), the second pass also
// prefetches it into L2, a row's lines a row, while this head's rows come from L1: alternated,
// three runs each, a bf16 state's batch-32 / 64 kimi-linear-small steps took 80.0 / 79.6 / 78.4 and
// 113.6 / 113.3 / 114.2 ms against 80.2 / 83.2 / 82.0 and 117.6 / 119.6 / 121.4 without, k3-mini
// -2% and level. Not for the fp32 state (a 64 KiB head, no longer read from L1 in the second pass):
// batch-32 steps 84.3-87.0 against 85.4-85.6 ms (earlier on the Zen 5 host, 2-3% slower too).
template <class State, int V, class T>
KIMI_INLINE void RecurrentHeadFixed(float* o, const float* q, const float* k, const float* v,
                                    const float* g, const float* beta, T* S, const KdaDims& d,
                                    int64_t h, float scale, const T* next = nullptr) {
  constexpr int kN = V / 16;
  constexpr int64_t K = V;
  const int64_t H = d.H;
  float decay[K];
  for (int64_t t = 0; t < d.T; ++t) {
    const TokenRows in(q, k, v, g, beta, t, h, H, K, V);
    const float *qt = in.q, *kt = in.k, *vt = in.v;
    ExpNonPositiveArray(decay, in.g, K);
    const float bt = in.beta;
    Vec16 kv[kN] = {};
    for (int64_t i = 0; i < K; ++i) {
      const T* row = S + i * V;
      const float ki = kt[i];
#pragma GCC unroll 8
      for (int c = 0; c < kN; ++c) {
        const Vec16 r = State::Load(row + 16 * c) * decay[i];
        kv[c] += r * ki;
      }
    }
    Vec16 u[kN], out[kN] = {};
#pragma GCC unroll 8
    for (int c = 0; c < kN; ++c) u[c] = bt * (Load<16>(vt + 16 * c) - kv[c]);
    for (int64_t i = 0; i < K; ++i) {
      T* row = S + i * V;
      const float ki = kt[i];
      const float qi = qt[i] * scale;
      if (next) {
        const char* ahead = reinterpret_cast<const char*>(next + i * V);
        for (int line = 0; line < V * static_cast<int>(sizeof(T)); line += 64) {
          __builtin_prefetch(ahead + line, 0, 2);  // into L2 (prefetcht1)
        }
      }
#pragma GCC unroll 8
      for (int c = 0; c < kN; ++c) {
        const Vec16 update = ki * u[c];
        const Vec16 r = State::Load(row + 16 * c) * decay[i] + update;
        State::Store(row + 16 * c, r);
        out[c] += r * qi;
      }
    }
    float* ot = o + (t * H + h) * V;
#pragma GCC unroll 8
    for (int c = 0; c < kN; ++c) Store<16>(ot + 16 * c, out[c]);
  }
}

KIMI_CLONES void RecurrentHead(float* o, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* S, const KdaDims& d, int64_t h, float scale) {
  if (d.K == 128 && d.V == 128) {
    return RecurrentHeadFixed<F32State, 128>(o, q, k, v, g, beta, S, d, h, scale);
  }
  const int64_t K = d.K, V = d.V, H = d.H;
  std::vector<float> kv(V), u(V), out(V), decay(K);
  for (int64_t t = 0; t < d.T; ++t) {
    const TokenRows in(q, k, v, g, beta, t, h, H, K, V);
    const float *qt = in.q, *kt = in.k, *vt = in.v;
    ExpNonPositiveArray(decay.data(), in.g, K);
    const float bt = in.beta;
    // S = diag(exp(g)) S, and kv = S^T k on the decayed state, in one pass.
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = kt[i];
      for (int64_t j = 0; j < V; ++j) {
        row[j] *= decay[i];
        kv[j] += row[j] * ki;
      }
    }
    for (int64_t j = 0; j < V; ++j) u[j] = bt * (vt[j] - kv[j]);
    // S += k u^T, and o = S^T (scale q) on the updated state.
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = kt[i];
      const float qi = qt[i] * scale;
      for (int64_t j = 0; j < V; ++j) {
        row[j] += ki * u[j];
        out[j] += row[j] * qi;
      }
    }
    std::copy(out.begin(), out.end(), o + (t * H + h) * V);
  }
}

// A head's bf16 state widened into fp32 (exact), and rounded back in place (what storing it as
// bf16 and reading it again gives).
void WidenBf16(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}
void RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToF32(StateToBf16(x[i]));
}
void NarrowToBf16(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = StateToBf16(in[i]);
}

// RecurrentHead over a bf16 state: K = V = 128 in registers (RecurrentHeadFixed); any other
// width token by token on the widened state, rounded after each, which is the definition (the
// tests hold the fixed form to its bits).
KIMI_CLONES void RecurrentHeadBf16(float* o, const float* q, const float* k, const float* v,
                                   const float* g, const float* beta, uint16_t* S, const KdaDims& d,
                                   int64_t h, float scale, const uint16_t* next) {
  if (d.K == 128 && d.V == 128) {
    return RecurrentHeadFixed<GenericBf16, 128>(o, q, k, v, g, beta, S, d, h, scale, next);
  }
  const int64_t n = d.K * d.V, H = d.H;
  std::vector<float> wide(n);
  WidenBf16(wide.data(), S, n);
  const KdaDims one{1, H, d.K, d.V};
  for (int64_t t = 0; t < d.T; ++t) {
    RecurrentHead(o + t * H * d.V, q + t * H * d.K, k + t * H * d.K, v + t * H * d.V,
                  g + t * H * d.K, beta + t * H, wide.data(), one, h, scale);
    if (t + 1 < d.T) RoundToBf16(wide.data(), n);  // the last token's rounding is the narrowing
  }
  NarrowToBf16(S, wide.data(), n);
}

// The same on AVX-512 BF16: one VCVTNEPS2BF16 rounds 16 entries where the vector form takes ten
// integer operations; the widening is the vector form's. In cache (one head, one thread, the AMX
// host) a token's head took 4.0 us with GenericBf16 and 2.9 with this, against 2.3 with an fp32
// state.
#define KIMI_BF16_TARGET __attribute__((target("arch=x86-64-v4,avx512bf16")))
struct NativeBf16 {
  static inline KIMI_BF16_TARGET Vec16 Load(const uint16_t* p) { return GenericBf16::Load(p); }
  static inline KIMI_BF16_TARGET void Store(uint16_t* p, Vec16 v) {
    const __m256bh h = _mm512_cvtneps_pbh(reinterpret_cast<__m512>(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(h));
  }
};
// (flatten: Load and Store, built for this target, can only be inlined once the template is.)
KIMI_BF16_TARGET __attribute__((flatten)) void RecurrentHeadBf16Native(
    float* o, const float* q, const float* k, const float* v, const float* g, const float* beta,
    uint16_t* S, const KdaDims& d, int64_t h, float scale, const uint16_t* next) {
  RecurrentHeadFixed<NativeBf16, 128>(o, q, k, v, g, beta, S, d, h, scale, next);
}
#undef KIMI_BF16_TARGET

typedef void (*RecurrentHeadBf16Fn)(float*, const float*, const float*, const float*, const float*,
                                    const float*, uint16_t*, const KdaDims&, int64_t, float,
                                    const uint16_t*);
// The native form for K = V = 128 where the kernels run AVX-512 (MatMulIsa, so KIMI_ISA=avx2 takes
// the vector form) and the machine has AVX-512 BF16; the same bits either way.
RecurrentHeadBf16Fn RecurrentHeadBf16For(const KdaDims& d) {
  static const bool bf16 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16"));
  if (d.K == 128 && d.V == 128 && bf16 && HasAvx512(MatMulIsa())) return RecurrentHeadBf16Native;
  return RecurrentHeadBf16;
}

// y[0, n) += a * x[0, n)
KIMI_INLINE void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// The chunked form below is built once per instruction-set level with L-float vectors (lanes.h):
// L = 16 for AVX-512, 8 for AVX2, 4 for the baseline; register tiles sized to each level's
// registers (32 of 512 bits, 16 of 256, 16 of 128).
template <int L>
struct ChunkTiles;
template <>
struct ChunkTiles<16> {
  static constexpr int kWideRows = 4, kWideVecs = 4;  // 4 x 64 floats: 16 accumulators
  static constexpr int kNarrowRows = 16;              // 16 x 16 floats
};
// AVX2: 4 x 16 floats (8 accumulators) and 3 x 32 came out level in a probe of the chunked form,
// 2 x 32 and 6 x 16 slower; 4 rows divide the products' 64 and 128.
template <>
struct ChunkTiles<8> {
  static constexpr int kWideRows = 4, kWideVecs = 2;  // 4 x 16 floats: 8 accumulators
  static constexpr int kNarrowRows = 8;               // 8 x 8 floats
};
template <>
struct ChunkTiles<4> {
  static constexpr int kWideRows = 4, kWideVecs = 2;  // 4 x 8 floats: 8 accumulators
  static constexpr int kNarrowRows = 8;               // 8 x 4 floats
};

// One register tile: C[kR x kN L] += sum_{m < kd} A(r, m) B[m, 0:kN L], A(r, m) = A[r * ars + m *
// acs]; the sum over m runs in ascending order for every element. (As float arrays, a 16 x 16 tile
// was vectorised across its rows, with shuffles: the accumulators are vectors here.)
template <int L, int kR, int kN>
KIMI_INLINE void TileAcc(float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs,
                         const float* B, int64_t ldb, int64_t kd) {
  typedef typename LaneVec<L>::V V;
  V acc[kR][kN];
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r) {
#pragma GCC unroll 4
    for (int n = 0; n < kN; ++n) acc[r][n] = Load<L>(C + r * ldc + L * n);
  }
  for (int64_t m = 0; m < kd; ++m) {
    V b[kN];
#pragma GCC unroll 4
    for (int n = 0; n < kN; ++n) b[n] = Load<L>(B + m * ldb + L * n);
    const float* a = A + m * acs;
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r) {
      const float ar = a[r * ars];
#pragma GCC unroll 4
      for (int n = 0; n < kN; ++n) acc[r][n] += ar * b[n];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r) {
#pragma GCC unroll 4
    for (int n = 0; n < kN; ++n) Store<L>(C + r * ldc + L * n, acc[r][n]);
  }
}

struct GemmArgs {
  float* C;
  int64_t ldc;
  const float* A;
  int64_t ars, acs;
  const float* B;
  int64_t ldb, M, Kd;
  bool lower;
  int64_t kd(int64_t rows_end) const { return lower ? std::min(Kd, rows_end) : Kd; }
};

// Rows from i0 of columns [n0, n0 + kN L) in tiles of kR rows, as far as whole tiles go; returns
// the first row left.
template <int L, int kR, int kN>
KIMI_INLINE int64_t TileRows(const GemmArgs& g, int64_t i0, int64_t n0) {
  for (; i0 + kR <= g.M; i0 += kR) {
    TileAcc<L, kR, kN>(g.C + i0 * g.ldc + n0, g.ldc, g.A + i0 * g.ars, g.ars, g.acs, g.B + n0,
                       g.ldb, g.kd(i0 + kR));
  }
  return i0;
}
KIMI_INLINE void RowsOneByOne(const GemmArgs& g, int64_t i0, int64_t n0, int64_t nr) {
  for (int64_t i = i0; i < g.M; ++i) {
    float* c = g.C + i * g.ldc + n0;
    const int64_t kd = g.kd(i + 1);
    for (int64_t m = 0; m < kd; ++m) Axpy(c, g.A[i * g.ars + m * g.acs], g.B + m * g.ldb + n0, nr);
  }
}

// C[i, n] += sum_{m < kd(i)} A(i, m) B[m, n] for i < M, n < N; A(i, m) = A[i * ars + m * acs],
// B and C row-major. kd(i) = Kd, or min(Kd, i + 1) when `lower` (A lower triangular: rows i < m
// contribute zeros, so a tile may stop at its last row's kd and keep every element's sum). The
// wide tiles where their columns remain (the chunk's products are 64 or 128 wide), then L-wide
// columns in narrow tiles (the off-diagonal blocks of A and P: 16 rows by 16 to 64 columns), then
// 4-row tiles, then one row at a time. Every element's sum runs over m in ascending order whatever
// the tile: the tiling does not change bits.
template <int L>
KIMI_INLINE void GemmAcc(float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs,
                         const float* B, int64_t ldb, int64_t M, int64_t N, int64_t Kd,
                         bool lower = false) {
  typedef ChunkTiles<L> Tiles;
  constexpr int64_t kWide = Tiles::kWideVecs * L;
  const GemmArgs g{C, ldc, A, ars, acs, B, ldb, M, Kd, lower};
  int64_t n0 = 0;
  for (; n0 + kWide <= N; n0 += kWide) {
    RowsOneByOne(g, TileRows<L, Tiles::kWideRows, Tiles::kWideVecs>(g, 0, n0), n0, kWide);
  }
  for (; n0 + L <= N; n0 += L) {
    const int64_t i0 = TileRows<L, Tiles::kNarrowRows, 1>(g, 0, n0);
    RowsOneByOne(g, TileRows<L, 4, 1>(g, i0, n0), n0, L);
  }
  if (n0 < N) RowsOneByOne(g, 0, n0, N - n0);
}

// Sub-chunk: pairwise exps only inside these diagonal blocks. 8 against 16 takes half the pairwise
// exps (the largest cost outside the products) for more, cheap, off-diagonal product columns.
constexpr int64_t kSub = 8;

// a = sum_x ki[x] kj[x] e[x], p = sum_x qi[x] kj[x] e[x]: L lanes (x mod L), then SumLanes.
template <int L>
KIMI_INLINE void DecayedDots(const float* ki, const float* qi, const float* kj, const float* e,
                             int64_t K, float* a, float* p) {
  typedef typename LaneVec<L>::V V;
  V va = {}, vp = {};
  int64_t x = 0;
  for (; x + L <= K; x += L) {
    const V kje = Load<L>(kj + x) * Load<L>(e + x);
    va += Load<L>(ki + x) * kje;
    vp += Load<L>(qi + x) * kje;
  }
  for (int64_t l = 0; x < K; ++x, ++l) {
    const float kje = kj[x] * e[x];
    va[l] += ki[x] * kje;
    vp[l] += qi[x] * kje;
  }
  *a = SumLanes(va);
  *p = SumLanes(vp);
}

// T = (I + A)^-1 for A strictly lower triangular [c, c] (c <= 64), T's rows 64 wide and zeroed by
// the caller: row i = e_i - sum_{m<i} A_im T_m, kept in 64 / L registers over m. Row m is zero past
// its diagonal, so the full-width products add only zeros there: the same bits as one Axpy of
// m + 1 floats a row (the general loop in ChunkHead).
template <int L>
KIMI_INLINE void InvertUnitLower64(float* T, const float* A, int64_t c) {
  typedef typename LaneVec<L>::V V;
  constexpr int kN = 64 / L;
  for (int64_t i = 0; i < c; ++i) {
    V t[kN] = {};
    for (int64_t m = 0; m < i; ++m) {
      const float a = -A[i * c + m];
#pragma GCC unroll 16
      for (int q = 0; q < kN; ++q) t[q] += a * Load<L>(T + m * 64 + L * q);
    }
#pragma GCC unroll 16
    for (int q = 0; q < kN; ++q) Store<L>(T + i * 64 + L * q, t[q]);
    T[i * 64 + i] = 1.0f;
  }
}

// Scratch for one chunk of one head (chunk = the most tokens a chunk has). Row-major: Q, Kc, G,
// W, Khat, Qhat, Kd, ex [chunk, K]; Vc, U [chunk, V]; A, P, Tm [chunk, chunk]; LKQ [2 kSub, K];
// Lt [K, chunk]; AP [2 kSub, chunk].
struct ChunkScratch {
  int64_t chunk;
  std::vector<float> Q, Kc, Vc, beta, G, A, P, Tm, W, U, LKQ, Lt, AP, ex, Khat, Qhat, Kd, decay;
  ChunkScratch(int64_t c, int64_t K, int64_t V)
      : chunk(c),
        Q(c * K),
        Kc(c * K),
        Vc(c * V),
        beta(c),
        G(c * K),
        A(c * c),
        P(c * c),
        Tm(c * c),
        W(c * K),
        U(c * V),
        LKQ(2 * kSub * K),
        Lt(K * c),
        AP(2 * kSub * c),
        ex(c * K),
        Khat(c * K),
        Qhat(c * K),
        Kd(c * K),
        decay(K) {}
};

// One sequence's tensors, as KdaChunk takes them.
struct ChunkIo {
  float* o;
  const float *q, *k, *v, *g, *beta;
  KdaDims d;
  float scale;
};

// One chunk of c tokens starting at token t0, for head h; S [K, V] is updated in place.
//
// Write G_i = sum_{s<=i} g_s (cumulative log decay inside the chunk, per channel) and
// X_i = diag(exp(-G_i)) S_i. The recurrence becomes X_i = X_{i-1} + (k_i / exp(G_i)) u_i^T with
//     u_i = beta_i (v_i - S_0^T (exp(G_i) k_i) - sum_{j<i} A_ij u_j),
//     A_ij = sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d]).
// In matrix form (I + diag(beta) A) u = diag(beta) (V - Khat S_0), Khat_i = exp(G_i) k_i. With the
// UT transform T = (I + diag(beta) A)^-1 (unit lower triangular):
//     W = T diag(beta) Khat,  U = T diag(beta) V,  u = U - W S_0                 (the WY/UT form)
//     o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j,  Qhat_i = scale exp(G_i) q_i,
//     P_ij = scale sum_d q_i[d] k_j[d] exp(G_i[d] - G_j[d])
//     S_c = diag(exp(G_c)) S_0 + sum_j (exp(G_c - G_j) k_j) u_j^T
//
// The c^2 K pairwise exps of A and P are factorised over sub-chunks of kSub tokens: for i in the
// sub-chunk starting at s and j < s, exp(G_i - G_j) = exp(G_i - G_s) exp(G_s - G_j), both factors
// <= 1 (g <= 0), so the off-diagonal blocks are plain matrix products of rescaled q, k; only the
// diagonal blocks take pairwise exps. Every exponent is of a non-positive number: nothing overflows.
template <int L>
KIMI_INLINE void ChunkHead(const ChunkIo& io, float* S, int64_t h, int64_t t0, int64_t c,
                           ChunkScratch& s) {
  const float *q = io.q, *k = io.k, *v = io.v, *g = io.g, *beta = io.beta;
  const int64_t K = io.d.K, V = io.d.V, H = io.d.H;
  const float scale = io.scale;
  float *Q = s.Q.data(), *Kc = s.Kc.data(), *Vc = s.Vc.data(), *G = s.G.data();
  float *A = s.A.data(), *P = s.P.data(), *Tm = s.Tm.data(), *W = s.W.data(), *U = s.U.data();
  float* ex = s.ex.data();
  for (int64_t i = 0; i < c; ++i) {
    const float* gi = At(g, t0 + i, h, H, K);
    std::copy_n(At(q, t0 + i, h, H, K), K, Q + i * K);
    std::copy_n(At(k, t0 + i, h, H, K), K, Kc + i * K);
    std::copy_n(At(v, t0 + i, h, H, V), V, Vc + i * V);
    s.beta[i] = beta[(t0 + i) * H + h];
    for (int64_t x = 0; x < K; ++x) G[i * K + x] = (i ? G[(i - 1) * K + x] : 0.0f) + gi[x];
  }
  // A (strictly lower, rows scaled by beta_i) and P (lower with diagonal, scaled).
  std::fill_n(A, c * c, 0.0f);
  std::fill_n(P, c * c, 0.0f);
  float *LKQ = s.LKQ.data(), *Lt = s.Lt.data(), *AP = s.AP.data();
  float* carry = s.decay.data();  // exp(G_s - G_p): the factor of Lt's carried-over columns
  std::fill_n(Lt, K * c, 0.0f);
  for (int64_t s0 = 0; s0 < c; s0 += kSub) {
    const int64_t s1 = std::min(s0 + kSub, c);
    const float* Gs = G + s0 * K;
    // Diagonal block: pairwise exps.
    for (int64_t i = s0; i < s1; ++i) {
      for (int64_t j = s0; j <= i; ++j) {
        for (int64_t x = 0; x < K; ++x) ex[j * K + x] = G[i * K + x] - G[j * K + x];
      }
      ExpNonPositiveArray(ex + s0 * K, ex + s0 * K, (i - s0 + 1) * K);
      for (int64_t j = s0; j <= i; ++j) {
        float a, p;
        DecayedDots<L>(Kc + i * K, Q + i * K, Kc + j * K, ex + j * K, K, &a, &p);
        if (j < i) A[i * c + j] = s.beta[i] * a;
        P[i * c + j] = scale * p;
      }
    }
    if (s0 == 0) continue;
    // Off-diagonal blocks (j < s0): exp(G_i - G_j) = exp(G_i - G_s) exp(G_s - G_j), as one product
    // [k_i exp(G_i - G_s); q_i exp(G_i - G_s)] (2 x rows, K) by Lt (K, s0), Lt[x, j] = k_j[x]
    // exp(G_s[x] - G_j[x]). Lt carries over from the last sub-chunk (reference p = s0 - kSub):
    // its columns j < p times exp(G_s - G_p), the new columns p <= j < s0 from their own exps.
    const int64_t rows = s1 - s0, p0 = s0 - kSub;
    for (int64_t i = s0; i < s1; ++i) {
      for (int64_t x = 0; x < K; ++x) ex[i * K + x] = G[i * K + x] - Gs[x];
    }
    ExpNonPositiveArray(ex + s0 * K, ex + s0 * K, rows * K);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t x = 0; x < K; ++x) {
        LKQ[i * K + x] = Kc[(s0 + i) * K + x] * ex[(s0 + i) * K + x];
        LKQ[(rows + i) * K + x] = Q[(s0 + i) * K + x] * ex[(s0 + i) * K + x];
      }
    }
    for (int64_t j = p0; j < s0; ++j) {
      for (int64_t x = 0; x < K; ++x) ex[j * K + x] = Gs[x] - G[j * K + x];
    }
    ExpNonPositiveArray(ex + p0 * K, ex + p0 * K, kSub * K);
    for (int64_t x = 0; x < K; ++x) carry[x] = Gs[x] - G[p0 * K + x];
    ExpNonPositiveArray(carry, carry, K);
    for (int64_t x = 0; x < K; ++x) {
      float* lt = Lt + x * c;
      for (int64_t j = 0; j < p0; ++j) lt[j] *= carry[x];
      for (int64_t j = p0; j < s0; ++j) lt[j] = Kc[j * K + x] * ex[j * K + x];
    }
    // Columns rounded up to the 16-wide register tile; Lt's columns from s0 on are still zero.
    const int64_t n = std::min(c, (s0 + 15) / 16 * 16);
    std::fill_n(AP, 2 * rows * n, 0.0f);
    GemmAcc<L>(AP, n, LKQ, K, 1, Lt, c, 2 * rows, n, K);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < s0; ++j) {
        A[(s0 + i) * c + j] = s.beta[s0 + i] * AP[i * n + j];
        P[(s0 + i) * c + j] = scale * AP[(rows + i) * n + j];
      }
    }
  }
  // T = (I + A)^-1 by forward substitution, a row at a time: T_i = e_i - sum_{m<i} A_im T_m. T's
  // rows are lt = the scratch's chunk wide, zero past the diagonal.
  const int64_t lt = s.chunk;
  std::fill_n(Tm, c * lt, 0.0f);
  if (lt == 64 && L >= 8) {  // (16 registers of 4 floats would spill)
    InvertUnitLower64<L>(Tm, A, c);
  } else {
    for (int64_t i = 0; i < c; ++i) {
      float* ti = Tm + i * lt;
      for (int64_t m = 0; m < i; ++m) Axpy(ti, -A[i * c + m], Tm + m * lt, m + 1);
      ti[i] = 1.0f;
    }
  }
  // W = T diag(beta) Khat, U = T diag(beta) V (T lower triangular; B = T diag(beta) in Tm).
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) Tm[i * lt + j] *= s.beta[j];
  }
  float* Khat = s.Khat.data();
  ExpNonPositiveArray(ex, G, c * K);
  for (int64_t j = 0; j < c * K; ++j) Khat[j] = Kc[j] * ex[j];
  std::fill_n(W, c * K, 0.0f);
  std::fill_n(U, c * V, 0.0f);
  GemmAcc<L>(W, K, Tm, lt, 1, Khat, K, c, K, c, /*lower=*/true);
  GemmAcc<L>(U, V, Tm, lt, 1, Vc, V, c, V, c, /*lower=*/true);
  // u = U - W S_0 (in U).
  for (int64_t j = 0; j < c * K; ++j) W[j] = -W[j];
  GemmAcc<L>(U, V, W, K, 1, S, V, c, V, K);
  // o_i = S_0^T Qhat_i + sum_{j<=i} P_ij u_j, with Qhat = scale exp(G) q (exp(G) still in ex).
  float* Qhat = s.Qhat.data();
  for (int64_t j = 0; j < c * K; ++j) Qhat[j] = scale * Q[j] * ex[j];
  float* oc = io.o + (t0 * H + h) * V;  // row i of this head's output: oc + i * H * V
  for (int64_t i = 0; i < c; ++i) std::fill_n(oc + i * H * V, V, 0.0f);
  GemmAcc<L>(oc, H * V, Qhat, K, 1, S, V, c, V, K);
  GemmAcc<L>(oc, H * V, P, c, 1, U, V, c, V, c, /*lower=*/true);
  // S_c = diag(exp(G_c)) S_0 + sum_j (exp(G_c - G_j) k_j) u_j^T.
  const float* Gc = G + (c - 1) * K;
  float *Kd = s.Kd.data(), *decay = s.decay.data();
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t x = 0; x < K; ++x) ex[j * K + x] = Gc[x] - G[j * K + x];
  }
  ExpNonPositiveArray(ex, ex, c * K);
  for (int64_t j = 0; j < c * K; ++j) Kd[j] = Kc[j] * ex[j];
  ExpNonPositiveArray(decay, Gc, K);
  for (int64_t x = 0; x < K; ++x) {
    for (int64_t y = 0; y < V; ++y) S[x * V + y] *= decay[x];
  }
  GemmAcc<L>(S, V, Kd, 1, K, U, V, K, V, c);  // A(x, j) = Kd[j, x]
}

// ChunkHead built for each instruction-set level (KIMI_CLONES cannot give each level its own L),
// chosen as the kernels' instruction set (MatMulIsa) says, as mla.cc's AttendChunk.
typedef void (*ChunkHeadFn)(const ChunkIo&, float*, int64_t, int64_t, int64_t, ChunkScratch&);
__attribute__((target("arch=x86-64-v4"))) void ChunkHeadV4(const ChunkIo& io, float* S, int64_t h,
                                                           int64_t t0, int64_t c, ChunkScratch& s) {
  ChunkHead<16>(io, S, h, t0, c, s);
}
__attribute__((target("arch=x86-64-v3"))) void ChunkHeadV3(const ChunkIo& io, float* S, int64_t h,
                                                           int64_t t0, int64_t c, ChunkScratch& s) {
  ChunkHead<8>(io, S, h, t0, c, s);
}
void ChunkHeadBaseline(const ChunkIo& io, float* S, int64_t h, int64_t t0, int64_t c,
                       ChunkScratch& s) {
  ChunkHead<4>(io, S, h, t0, c, s);
}
ChunkHeadFn ChunkHeadForIsa() {
  static const bool v4 = (__builtin_cpu_init(), __builtin_cpu_supports("x86-64-v4"));
  static const bool v3 = __builtin_cpu_supports("x86-64-v3");
  const Isa isa = MatMulIsa();
  if (HasAvx512(isa) && v4) return ChunkHeadV4;
  if (isa != Isa::kScalar && v3) return ChunkHeadV3;
  return ChunkHeadBaseline;
}
#pragma GCC diagnostic pop

}  // namespace

void KdaRecurrent(float* o, const float* q, const float* k, const float* v, const float* g,
                  const float* beta, float* state, const KdaDims& d, float scale) {
  ParallelFor(d.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      RecurrentHead(o, q, k, v, g, beta, state + h * d.K * d.V, d, h, scale);
    }
  });
}

// The chunks of a sequence's T tokens on the absolute grid of `chunk` (pos0 tokens already in the
// state): fn(t0, c) for each, in order.
template <class Fn>
void ForEachChunk(int64_t T, int64_t pos0, int chunk, const Fn& fn) {
  for (int64_t t0 = 0; t0 < T;) {
    const int64_t c = std::min<int64_t>(chunk - (pos0 + t0) % chunk, T - t0);
    fn(t0, c);
    t0 += c;
  }
}

// Head h's chunk [t0, t0 + c), its fp32 state in S.
void ChunkOfHead(const ChunkIo& io, ChunkHeadFn chunk_head, float* S, int64_t h, int64_t t0,
                 int64_t c, ChunkScratch& scratch) {
  if (c > 1) return chunk_head(io, S, h, t0, c, scratch);
  // A one-token chunk (a prompt's last token just past the grid) takes the recurrent step, which
  // that token gets when a step carries it alone: the chunked form's arithmetic differs in the
  // last bits (about 2e-6 in a logit), and a seeded request's tokens would then depend on how the
  // scheduler split its prompt.
  const KdaDims& d = io.d;
  const KdaDims one{1, d.H, d.K, d.V};
  RecurrentHead(io.o + t0 * d.H * d.V, io.q + t0 * d.H * d.K, io.k + t0 * d.H * d.K,
                io.v + t0 * d.H * d.V, io.g + t0 * d.H * d.K, io.beta + t0 * d.H, S, one, h,
                io.scale);
}

// Both KdaChunk forms run a thread's heads chunk by chunk, every head of its part for a chunk
// before the next chunk (a head's chunks in order: the same bits as head after head). A token's
// rows are [H, K] per tensor, so a head's slice of a chunk is 64 runs of 512 bytes a page apart;
// a part's heads side by side make those runs the part's heads long. One 16k-token prompt of
// kimi-linear-small's 8 heads on 2 threads (kda.prefill.per_token_16k_over_1k, three runs each,
// alternated): 7.2-8.0 us a token against 7.9-8.2 head after head, the 16k / 1k figure 1.03-1.06
// against 1.09-1.15 (1k level: its 20 MB stay in cache either way).
void KdaChunk(float* o, const float* q, const float* k, const float* v, const float* g,
              const float* beta, float* state, const KdaDims& d, float scale, int64_t pos0,
              int chunk) {
  const ChunkHeadFn chunk_head = ChunkHeadForIsa();
  const ChunkIo io{o, q, k, v, g, beta, d, scale};
  ParallelFor(d.H, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch scratch(chunk, d.K, d.V);
    ForEachChunk(d.T, pos0, chunk, [&](int64_t t0, int64_t c) {
      for (int64_t h = begin; h < end; ++h) {
        ChunkOfHead(io, chunk_head, state + h * d.K * d.V, h, t0, c, scratch);
      }
    });
  });
}

void KdaRecurrent(float* o, const float* q, const float* k, const float* v, const float* g,
                  const float* beta, uint16_t* state, const KdaDims& d, float scale) {
  const RecurrentHeadBf16Fn head = RecurrentHeadBf16For(d);
  ParallelFor(d.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const uint16_t* next = h + 1 < end ? state + (h + 1) * d.K * d.V : nullptr;
      head(o, q, k, v, g, beta, state + h * d.K * d.V, d, h, scale, next);
    }
  });
}

void KdaChunk(float* o, const float* q, const float* k, const float* v, const float* g,
              const float* beta, uint16_t* state, const KdaDims& d, float scale, int64_t pos0,
              int chunk) {
  const ChunkHeadFn chunk_head = ChunkHeadForIsa();
  const ChunkIo io{o, q, k, v, g, beta, d, scale};
  const int64_t n = d.K * d.V;
  ParallelFor(d.H, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch scratch(chunk, d.K, d.V);
    // The part's states widened to fp32, rounded to bf16 after every chunk but the last, whose
    // rounding is the narrowing back.
    std::vector<float> wide((end - begin) * n);
    for (int64_t h = begin; h < end; ++h) WidenBf16(&wide[(h - begin) * n], state + h * n, n);
    ForEachChunk(d.T, pos0, chunk, [&](int64_t t0, int64_t c) {
      for (int64_t h = begin; h < end; ++h) {
        float* S = &wide[(h - begin) * n];
        ChunkOfHead(io, chunk_head, S, h, t0, c, scratch);
        if (t0 + c < d.T) RoundToBf16(S, n);
      }
    });
    for (int64_t h = begin; h < end; ++h) NarrowToBf16(state + h * n, &wide[(h - begin) * n], n);
  });
}

void KdaGate(float* g, const float* g_raw, int64_t T, int64_t H, int64_t K, const float* a_log,
             const float* dt_bias, std::optional<float> lower_bound) {
  // Over the threads by (token, head): an exp per element, about 2% of a batch-64 step serially.
  ParallelFor(T * H, std::max<int64_t>(1, 1024 / std::max<int64_t>(K, 1)),
              [&](int64_t begin, int64_t end) {
                // x + dt_bias times `in`, the vectorised activation over the thread's part
                // (SigmoidInPlace / SoftplusInPlace: the same result wherever an element sits),
                // then times `out`. K3: in = exp(A_log), sigmoid, out = lower_bound; Kimi Linear:
                // in = 1, softplus, out = -exp(A_log). With libm one element at a time the gate
                // took about 1.4% (K3) and 3% (Kimi Linear) of a 512-token prefill.
                for (int64_t th = begin; th < end; ++th) {
                  const int64_t h = th % H;
                  const float in = lower_bound ? std::exp(a_log[h]) : 1.0f;
                  for (int64_t x = 0; x < K; ++x) {
                    g[th * K + x] = in * (g_raw[th * K + x] + dt_bias[h * K + x]);
                  }
                }
                float* part = g + begin * K;
                if (lower_bound) {
                  SigmoidInPlace(part, (end - begin) * K);
                } else {
                  SoftplusInPlace(part, (end - begin) * K);
                }
                for (int64_t th = begin; th < end; ++th) {
                  const float out = lower_bound ? *lower_bound : -std::exp(a_log[th % H]);
                  for (int64_t x = 0; x < K; ++x) part[(th - begin) * K + x] *= out;
                }
              });
}

}  // namespace kimi::cpu
