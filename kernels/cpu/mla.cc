#include "kernels/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

constexpr int64_t kRows = 4;   // query rows per register tile
constexpr int64_t kKeys = 32;  // keys per block (K3's 576-float rows: 72 KiB, in L2)
// Keys per chunk: each chunk's softmax state is computed on its own and the chunks are folded
// in order (FoldChunk), so decode can share the keys out over the threads.
constexpr int64_t kChunkKeys = 128;

// The dot products and value sums below run on L floats as one value (GCC vector types): L = 16 in
// the AVX-512 build of AttendChunk (one 512-bit register each, 32 of them), 8 in the AVX2 build and
// 4 in the baseline one (16 registers), with register tiles sized to fit. Every function taking one
// is inlined into those builds, so the ABI note GCC gives for the baseline does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <int L>
struct Lanes;
template <>
struct Lanes<16> {
  typedef LaneVec<16>::V V;
  static constexpr int kKeyTile = 4;    // keys per score tile (with up to kRows rows)
  static constexpr int kValueVecs = 4;  // vectors of each row's output per value pass
};
template <>
struct Lanes<8> {
  typedef LaneVec<8>::V V;
  static constexpr int kKeyTile = 2;
  static constexpr int kValueVecs = 2;
};
template <>
struct Lanes<4> {
  typedef LaneVec<4>::V V;
  static constexpr int kKeyTile = 2;
  static constexpr int kValueVecs = 2;
};

// sc[i][j0 + j] = q[i] . key[j0 + j] for i < MR, j < Lanes<L>::kKeyTile, over `width`: L lanes of
// products per (row, key) pair, each lane summed over the width in order, then the lanes by
// SumLanes. The keys are read as stored (rows of the cache); a pair's arithmetic does not depend
// on the other pairs. With `ahead`, the rows ahead[j0 + j] are prefetched into L2 alongside, a line
// for each line of key read.
template <int L, int MR>
KIMI_INLINE void Scores(float (*sc)[kKeys], int64_t j0, const float* const* q,
                        const float* const* key, int64_t width, const float* const* ahead) {
  typedef typename Lanes<L>::V V;
  constexpr int NJ = Lanes<L>::kKeyTile;
  V acc[MR][NJ] = {};
  const float* k[NJ];
  for (int j = 0; j < NJ; ++j) k[j] = key[j0 + j];
  const float* pf[NJ];
  if (ahead != nullptr) {
    for (int j = 0; j < NJ; ++j) pf[j] = ahead[j0 + j];
  }
  int64_t c = 0;
  for (; c + L <= width; c += L) {
    V kv[NJ];
    if (ahead != nullptr && (c * sizeof(float)) % 64 == 0) {
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) __builtin_prefetch(pf[j] + c, 0, 2);  // T1
    }
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) kv[j] = Load<L>(k[j] + c);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const V qv = Load<L>(q[i] + c);
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) acc[i][j] += qv * kv[j];
    }
  }
  if (c < width) {
    V kv[NJ];
    for (int j = 0; j < NJ; ++j) kv[j] = LoadPartial<L>(k[j] + c, width - c);
    for (int i = 0; i < MR; ++i) {
      const V qv = LoadPartial<L>(q[i] + c, width - c);
      for (int j = 0; j < NJ; ++j) acc[i][j] += qv * kv[j];
    }
  }
  if constexpr (L == 16 && NJ == 4) {  // the 16 sums in one transposed reduction, same tree
    V v[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t)
      v[t] = acc[t % 4 < MR ? t % 4 : 0][t / 4];  // v[4j + i] = acc[i][j]
    float r[16];                                  // r[4i + j] = SumLanes(acc[i][j])
    SumLanes16(v, r);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) std::memcpy(&sc[i][j0], r + 4 * i, 4 * sizeof(float));
  } else {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) sc[i][j0 + j] = SumLanes(acc[i][j]);
    }
  }
}

// For each row i < MR of a tile: o_i = o_i * corr[i] + sum_j p[i][j] key[j][0 .. rank) over
// j < visible[i], a few vectors of every row's output in registers at a time, each key's matching
// columns loaded once for all the rows. Per element the operations and their order are those of
// one key after another, row by row.
template <int L, int MR>
KIMI_INLINE void AddValues(float* const* o, const float* corr, const float (*p)[kKeys],
                           const int64_t* visible, const float* const* key, int64_t rank) {
  typedef typename Lanes<L>::V V;
  constexpr int U = Lanes<L>::kValueVecs;
  int64_t most = 0;
  for (int i = 0; i < MR; ++i) most = std::max(most, visible[i]);
  int64_t c = 0;
  for (; c + U * L <= rank; c += U * L) {
    V acc[MR][U];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) acc[i][u] = Load<L>(o[i] + c + L * u) * corr[i];
    }
    for (int64_t j = 0; j < most; ++j) {
      V kv[U];
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) kv[u] = Load<L>(key[j] + c + L * u);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        if (j >= visible[i]) continue;
        const float pij = p[i][j];
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) acc[i][u] += pij * kv[u];
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) Store<L>(o[i] + c + L * u, acc[i][u]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int64_t cc = c; cc < rank; ++cc) {
      float a = o[i][cc] * corr[i];
      for (int64_t j = 0; j < visible[i]; ++j) a += p[i][j] * key[j][cc];
      o[i][cc] = a;
    }
  }
}
#pragma GCC diagnostic pop

// One chunk's work (AttendChunk): where its states go, the rows and the chunk.
struct ChunkArgs {
  float* o;  // row r0's unnormalised output; row r0 + i's at o + i * ldo
  int64_t ldo;
  float* m;  // row r0's largest scaled score and exp sum; row r0 + i's at m / l + i * ldm
  float* l;
  int64_t ldm;
  const float* qa;  // every row's absorbed query, [T * heads, rank + rope]
  int64_t r0, r1, heads, first_pos;
  int64_t k0;  // the chunk's first key
  const PagedRows* cache;
  int64_t rank, rope;
  float scale;
};

// The partial softmax state of rows [r0, r1) of the [T * heads] query rows over the keys of
// chunk [k0, k0 + kChunkKeys) each row sees, row r at index i = r - r0: m[i * ldm] (the largest
// scaled score), l[i * ldm] (the sum of exp(score - m)) and o + i * ldo (the sum of
// exp(score - m) c_s, unnormalised). Every row must see at least the chunk's first key. Block after
// block of kKeys keys with an online softmax, every row of a tile against the same keys. A row's
// arithmetic does not depend on the other rows of its tile or range.
template <int L>
KIMI_INLINE void AttendChunkWith(const ChunkArgs& a) {
  float *const o = a.o, *const m = a.m, *const l = a.l;
  const int64_t ldo = a.ldo, ldm = a.ldm, r0 = a.r0, r1 = a.r1, heads = a.heads;
  const int64_t first_pos = a.first_pos, k0 = a.k0, rank = a.rank;
  const float* qa = a.qa;
  const PagedRows& cache = *a.cache;
  const float scale = a.scale;
  const int64_t width = rank + a.rope;
  const int64_t k1 = std::min(k0 + kChunkKeys, first_pos + (r1 - 1) / heads + 1);
  for (int64_t i = 0; i < r1 - r0; ++i) {
    m[i * ldm] = -std::numeric_limits<float>::infinity();
    l[i * ldm] = 0.0f;
    std::fill_n(o + i * ldo, rank, 0.0f);
  }
  // The keys of the next block (past the chunk's end, the next chunk's first: in decode a thread
  // takes its chunks in order) are prefetched into L2 while the first row tile scores this block.
  // A block's keys are a few short streams (rows of 0.75-2.25 KiB, pages of 16 rows anywhere in
  // the pool) that the hardware prefetcher hardly follows: without this the keys came in at 9.5-15
  // GB/s whatever the heads. One decode token on 2 threads, alternated in one process: at 64k
  // keys, kimi-linear-small dims (mla.decode.64k, two host phases) 7.2-9.2 -> 5.2-5.9 ms and
  // 6.4-7.2 -> 4.4-4.7 ms, k3-mini dims 3.44-3.52 -> 1.59-1.62 ms (AVX2: 8.7-8.9 -> 6.0, 3.70 ->
  // 2.15); at 16k keys, K3 dims (64 heads) 16.7 -> 13.7 ms. Within the chunk only 5.2-6.0 (against
  // 5.2-5.9); two blocks ahead level (0.94-1.01); into L1 (T0) 1.39-1.45x slower. 512-token
  // prefills and batched decode at short contexts level (0.998-1.002).
  const int64_t seen = first_pos + (r1 - 1) / heads + 1;  // keys the last row sees
  const float* key[kKeys];
  const float* next[kKeys];
  for (int64_t s0 = k0; s0 < k1; s0 += kKeys) {
    const int64_t nk = std::min(kKeys, k1 - s0);
    // Keys past the block's end repeat its last key; their scores are never used.
    for (int64_t j = 0; j < kKeys; ++j) key[j] = cache.Row(s0 + std::min(j, nk - 1));
    const int64_t nn = std::min(kKeys, seen - s0 - kKeys);  // keys in the next block
    for (int64_t j = 0; j < kKeys && nn > 0; ++j) {
      next[j] = cache.Row(s0 + kKeys + std::min(j, nn - 1));
    }
    for (int64_t i0 = r0; i0 < r1; i0 += kRows) {
      const int64_t mr = std::min(kRows, r1 - i0);
      const float* const* ahead = nn > 0 && i0 == r0 ? next : nullptr;
      float sc[kRows][kKeys];
      const float* q[kRows];
      for (int64_t i = 0; i < kRows; ++i) q[i] = qa + (i0 + std::min(i, mr - 1)) * width;
      for (int64_t j0 = 0; j0 < nk; j0 += Lanes<L>::kKeyTile) {
        switch (mr) {
          case 1:
            Scores<L, 1>(sc, j0, q, key, width, ahead);
            break;
          case 2:
            Scores<L, 2>(sc, j0, q, key, width, ahead);
            break;
          case 3:
            Scores<L, 3>(sc, j0, q, key, width, ahead);
            break;
          default:
            Scores<L, 4>(sc, j0, q, key, width, ahead);
            break;
        }
      }
      // The online softmax of each row over this block's visible keys.
      float p[kRows][kKeys], corr[kRows];
      int64_t visible[kRows];
      float* out[kRows];
      for (int64_t i = 0; i < kRows; ++i) {
        const int64_t r = i0 + std::min(i, mr - 1), at = (r - r0) * ldm;
        out[i] = o + (r - r0) * ldo;
        // Keys of this block the row sees (rows past the tile's end: none).
        visible[i] =
            i < mr ? std::max<int64_t>(0, std::min(nk, first_pos + r / heads + 1 - s0)) : 0;
        corr[i] = 1.0f;
        if (visible[i] == 0) continue;
        float mx = m[at];
        for (int64_t j = 0; j < visible[i]; ++j) mx = std::max(mx, sc[i][j] * scale);
        for (int64_t j = 0; j < kKeys; ++j) p[i][j] = ExpNonPositive(sc[i][j] * scale - mx);
        for (int64_t j = visible[i]; j < kKeys; ++j) p[i][j] = 0.0f;
        corr[i] = ExpNonPositive(m[at] - mx);  // 0 on the chunk's first block (-inf)
        float sum = 0.0f;
        for (int64_t j = 0; j < visible[i]; ++j) sum += p[i][j];
        l[at] = l[at] * corr[i] + sum;
        m[at] = mx;
      }
      switch (mr) {
        case 1:
          AddValues<L, 1>(out, corr, p, visible, key, rank);
          break;
        case 2:
          AddValues<L, 2>(out, corr, p, visible, key, rank);
          break;
        case 3:
          AddValues<L, 3>(out, corr, p, visible, key, rank);
          break;
        default:
          AddValues<L, 4>(out, corr, p, visible, key, rank);
          break;
      }
    }
  }
}

// AttendChunkWith built for each instruction-set level (KIMI_CLONES cannot give each level its own
// register tile: 16 accumulators of 16 lanes spill on AVX2, to several times the time), chosen by
// the kernels' instruction set (MatMulIsa: the best the machine has, or KIMI_ISA / SetMatMulIsa,
// so tests and users reach every build) within what the machine supports.
__attribute__((target("arch=x86-64-v4"))) void AttendChunkV4(const ChunkArgs& a) {
  AttendChunkWith<16>(a);
}
__attribute__((target("arch=x86-64-v3"))) void AttendChunkV3(const ChunkArgs& a) {
  AttendChunkWith<8>(a);
}
void AttendChunkBaseline(const ChunkArgs& a) { AttendChunkWith<4>(a); }
void AttendChunk(const ChunkArgs& a) {
  static const bool v4 = (__builtin_cpu_init(), __builtin_cpu_supports("x86-64-v4"));
  static const bool v3 = __builtin_cpu_supports("x86-64-v3");
  const Isa isa = MatMulIsa();
  if (HasAvx512(isa) && v4) return AttendChunkV4(a);
  if (isa != Isa::kScalar && v3) return AttendChunkV3(a);
  AttendChunkBaseline(a);
}

// The first of rows [r0, r1) that sees key k0 (row r sees keys 0 .. first_pos + r / heads); r1 if
// none does.
int64_t FirstRowSeeing(int64_t k0, int64_t r0, int64_t r1, int64_t heads, int64_t first_pos) {
  return std::min(r1, std::max(r0, (k0 - first_pos) * heads));
}

// A row's state over chunks 0 .. c - 1 (M, L, O) and chunk c's (m, l, o), merged into the first:
// the one order in which every row's chunks are combined, however the work was split.
KIMI_INLINE void FoldChunk(float& M, float& L, float* O, float m, float l, const float* o,
                           int64_t rank) {
  const float mx = std::max(M, m);
  const float a = ExpNonPositive(M - mx), b = ExpNonPositive(m - mx);
  L = L * a + l * b;
  for (int64_t c = 0; c < rank; ++c) O[c] = O[c] * a + o[c] * b;
  M = mx;
}

// Rows [r0, r1), every chunk they see in order, each folded in as it is done; then normalised.
KIMI_CLONES void AttendRows(float* out_lat, const float* qa, int64_t r0, int64_t r1, int64_t heads,
                            int64_t first_pos, const PagedRows& cache, int64_t rank, int64_t rope,
                            float scale) {
  const int64_t n = r1 - r0;
  std::vector<float> M(n), L(n), m(n), l(n), o(n * rank);
  const int64_t last_key = first_pos + (r1 - 1) / heads + 1;  // keys the last row sees
  for (int64_t k0 = 0; k0 < last_key; k0 += kChunkKeys) {
    if (k0 == 0) {  // the first chunk is every row's state so far
      AttendChunk({out_lat + r0 * rank, rank, M.data(), L.data(), 1, qa, r0, r1, heads, first_pos,
                   k0, &cache, rank, rope, scale});
      continue;
    }
    const int64_t first = FirstRowSeeing(k0, r0, r1, heads, first_pos);
    if (first == r1) continue;
    const int64_t at = first - r0;
    AttendChunk({&o[at * rank], rank, &m[at], &l[at], 1, qa, first, r1, heads, first_pos, k0,
                 &cache, rank, rope, scale});
    for (int64_t r = first; r < r1; ++r) {
      FoldChunk(M[r - r0], L[r - r0], out_lat + r * rank, m[r - r0], l[r - r0], &o[(r - r0) * rank],
                rank);
    }
  }
  for (int64_t r = r0; r < r1; ++r) {
    const float inv = 1.0f / L[r - r0];
    float* out = out_lat + r * rank;
    for (int64_t c = 0; c < rank; ++c) out[c] *= inv;
  }
}

// Few rows over many keys (decode): the chunks spread over the threads (all rows of a chunk
// together), each chunk's state kept, then every row's chunks folded in order as AttendRows does.
KIMI_CLONES void FoldRows(float* out_lat, const float* state, int64_t chunks, int64_t rows,
                          int64_t heads, int64_t first_pos, int64_t rank) {
  const int64_t stride = rank + 2;  // per (row, chunk): o, then m and l
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t seen = (first_pos + r / heads + kChunkKeys) / kChunkKeys;  // chunks it sees
    const float* st = state + r * chunks * stride;
    float* out = out_lat + r * rank;
    std::copy_n(st, rank, out);
    float M = st[rank], L = st[rank + 1];
    for (int64_t c = 1; c < seen && c < chunks; ++c) {
      const float* sc = st + c * stride;
      FoldChunk(M, L, out, sc[rank], sc[rank + 1], sc, rank);
    }
    const float inv = 1.0f / L;
    for (int64_t c = 0; c < rank; ++c) out[c] *= inv;
  }
}

// Rows [0, rows) cut into `parts` runs of whole register tiles whose keys under the causal mask
// (row r sees first_pos + r / heads + 1) add up to shares as equal as whole tiles allow: bounds
// [0, .., rows].
std::vector<int64_t> EqualWorkParts(int64_t rows, int64_t parts, int64_t heads, int64_t first_pos) {
  const auto keys = [&](int64_t r) { return first_pos + r / heads + 1; };
  int64_t total = 0;
  for (int64_t r = 0; r < rows; ++r) total += keys(r);
  std::vector<int64_t> bound = {0};
  int64_t done = 0;
  for (int64_t r = 0; r < rows; ++r) {
    done += keys(r);
    const int64_t cut = static_cast<int64_t>(bound.size());
    if ((r + 1) % kRows == 0 && cut < parts && done * parts >= total * cut) bound.push_back(r + 1);
  }
  if (bound.back() != rows) bound.push_back(rows);
  return bound;
}

}  // namespace

void MlaLatentAttention(float* out_lat, const float* qa, int64_t T, int64_t first_pos,
                        const PagedRows& cache, int64_t heads, int64_t rank, int64_t rope,
                        float scale) {
  const int64_t rows = T * heads;
  const int64_t chunks = (first_pos + T + kChunkKeys - 1) / kChunkKeys;  // of the last row
  const int64_t tiles = (rows + kRows - 1) / kRows;
  const int64_t threads = ThreadPool::Global().num_threads();
  if (tiles >= 2 * threads) {
    // Prefill: the rows shared out. Under the causal mask row r sees first_pos + r / heads + 1
    // keys, so equal row counts are unequal work (two halves of a fresh prompt: 1 : 3, the
    // caller waiting on the heavier half); the rows are cut where their keys add up to equal
    // parts, one or two per thread (at least four tiles a part), handed out as threads free up.
    // Each part reads the keys its last row sees, so more parts read the cache more often. One
    // fresh prompt's attention on 2 threads (a probe, builds alternated): 4096 tokens at
    // kimi-linear-small's 8 heads x 256 + 64 657-692 -> 424-434 ms; 512 tokens 9.2-9.4 -> 6.7-6.9
    // ms, at k3-mini's 4 x 128 + 64 2.8-3.8 -> 2.0-2.1 ms.
    const std::vector<int64_t> bound = EqualWorkParts(
        rows, std::clamp<int64_t>(tiles / 4, threads, 2 * threads), heads, first_pos);
    ThreadPool::Global().ParallelForChunks(
        static_cast<int64_t>(bound.size()) - 1, 1, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            AttendRows(out_lat, qa, bound[i], bound[i + 1], heads, first_pos, cache, rank, rope,
                       scale);
          }
        });
    return;
  }
  if (chunks == 1) {  // a few rows over a few keys
    ParallelFor(rows, std::max<int64_t>(1, std::min<int64_t>(4 * kRows, rows / 2)),
                [&](int64_t begin, int64_t end) {
                  AttendRows(out_lat, qa, begin, end, heads, first_pos, cache, rank, rope, scale);
                });
    return;
  }
  // Decode: the keys are shared out instead of the rows, so the threads do not each read the
  // whole cache; chunk states per (row, chunk), then folded in order.
  // (Filled with NaN rather than zeros, at the same cost: the state of a chunk a row does not see
  // is never written, and must never be folded.)
  const int64_t stride = rank + 2;
  std::vector<float> state(rows * chunks * stride, std::numeric_limits<float>::quiet_NaN());
  ParallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t first = FirstRowSeeing(c * kChunkKeys, 0, rows, heads, first_pos);
      if (first == rows) continue;
      // Row r's chunk c: o at state[(r * chunks + c) * stride], m and l after it.
      float* base = state.data() + (first * chunks + c) * stride;
      AttendChunk({base, chunks * stride, base + rank, base + rank + 1, chunks * stride, qa, first,
                   rows, heads, first_pos, c * kChunkKeys, &cache, rank, rope, scale});
    }
  });
  FoldRows(out_lat, state.data(), chunks, rows, heads, first_pos, rank);
}

void MlaAttention(float* out, const float* q, int64_t T, int64_t first_pos, const PagedRows& cache,
                  const Weight& w_kv_b, const MlaDims& d, float scale) {
  const int64_t qk = d.nope + d.rope, R = d.rank, width = R + d.rope;
  // Absorbed queries [T, heads, R + rope]: q_abs = W_UK_h^T q_nope, then q_pe.
  std::vector<float> qa(T * d.heads * width, 0.0f), w_uk(d.nope * R);
  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t row0 = h * (d.nope + d.v);
    for (int64_t n = 0; n < d.nope; ++n) DequantizeRow(&w_uk[n * R], w_kv_b, row0 + n);
    for (int64_t t = 0; t < T; ++t) {
      const float* qh = q + (t * d.heads + h) * qk;
      float* a = &qa[(t * d.heads + h) * width];
      for (int64_t n = 0; n < d.nope; ++n) {
        for (int64_t r = 0; r < R; ++r) a[r] += qh[n] * w_uk[n * R + r];
      }
      std::copy_n(qh + d.nope, d.rope, a + R);
    }
  }
  std::vector<float> o_lat(T * d.heads * R);
  MlaLatentAttention(o_lat.data(), qa.data(), T, first_pos, cache, d.heads, R, d.rope, scale);
  // o_h = W_UV_h o_lat for every query of each head.
  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t row0 = h * (d.nope + d.v);
    MatMul(out + h * d.v, d.heads * d.v, o_lat.data() + h * R, d.heads * R,
           w_kv_b.Rows(row0 + d.nope, d.v), T);
  }
}

}  // namespace kimi::cpu
