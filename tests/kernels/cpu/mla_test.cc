#include "kernels/cpu/mla.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

// The absorbed form against plain attention with decompressed keys and values, through a
// scattered page table.
TEST(Mla, AbsorbedEqualsDecompressedAttention) {
  const int64_t H = 3, Dn = 8, Dr = 4, Dv = 6, R = 12, S = 21, T = 5, page = 4;
  const MlaDims d{H, Dn, Dr, Dv, R};
  const int64_t width = R + Dr;
  const auto rows = testing::RandomVector(S * width, 1);
  const auto q = testing::RandomVector(T * H * (Dn + Dr), 2);
  const auto wkvb = testing::RandomVector(H * (Dn + Dv) * R, 3, -0.3f, 0.3f);
  const int64_t pages = (S + page - 1) / page;
  std::vector<int32_t> table(pages);
  std::vector<float> pool(pages * page * width, 0.0f);
  for (int64_t p = 0; p < pages; ++p) table[p] = static_cast<int32_t>((p * 5 + 1) % pages);  // a permutation (gcd(5, 6) = 1)
  for (int64_t s = 0; s < S; ++s) {
    std::copy_n(&rows[s * width], width, &pool[(table[s / page] * page + s % page) * width]);
  }
  Weight w;
  w.data = wkvb.data();
  w.format = WeightFormat::kF32;
  w.rows = H * (Dn + Dv);
  w.cols = R;
  std::vector<float> out(T * H * Dv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dn + Dr));
  MlaAttention(out.data(), q.data(), T, S - T, PagedRows{pool.data(), table.data(), page, width},
               w, d, scale);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = &q[(t * H + h) * (Dn + Dr)];
      const int64_t visible = S - T + t + 1;
      std::vector<double> sc(visible);
      double mx = -1e300;
      for (int64_t s = 0; s < visible; ++s) {
        double acc = 0.0;
        for (int64_t n = 0; n < Dn; ++n) {
          double k = 0.0;  // k_nope = W_UK c
          for (int64_t r = 0; r < R; ++r) k += wkvb[(h * (Dn + Dv) + n) * R + r] * rows[s * width + r];
          acc += qh[n] * k;
        }
        for (int64_t e = 0; e < Dr; ++e) acc += qh[Dn + e] * rows[s * width + R + e];
        sc[s] = acc * scale;
        mx = std::max(mx, sc[s]);
      }
      double den = 0.0;
      for (double& v : sc) den += (v = std::exp(v - mx));
      for (int64_t j = 0; j < Dv; ++j) {
        double want = 0.0;
        for (int64_t s = 0; s < visible; ++s) {
          double v = 0.0;
          for (int64_t r = 0; r < R; ++r) {
            v += wkvb[(h * (Dn + Dv) + Dn + j) * R + r] * rows[s * width + r];
          }
          want += sc[s] / den * v;
        }
        EXPECT_NEAR(out[(t * H + h) * Dv + j], want, 2e-6) << t << " " << h << " " << j;
      }
    }
  }
}

// A latent cache of S rows of `width` floats in [-1, 1] behind a scattered page table.
struct LatentCache {
  std::vector<float> rows, pool;
  std::vector<int32_t> table;
  int64_t width;
  static constexpr int64_t kPage = 16;
  LatentCache(int64_t S, int64_t width_, uint32_t seed) : width(width_) {
    rows = testing::RandomVector(S * width, seed);
    const int64_t pages = (S + kPage - 1) / kPage;
    table.resize(pages);
    pool.assign(pages * kPage * width, 0.0f);
    // Pages in reverse order, then neighbours swapped: no two consecutive positions adjacent.
    for (int64_t p = 0; p < pages; ++p)
      table[p] = static_cast<int32_t>(pages - 1 - (p ^ 1) % pages);
    if (pages % 2 == 1) table[pages - 1] = 0;
    for (int64_t s = 0; s < S; ++s) {
      std::copy_n(&rows[s * width], width, &pool[(table[s / kPage] * kPage + s % kPage) * width]);
    }
  }
  PagedRows View() { return PagedRows{pool.data(), table.data(), kPage, width}; }
};

// Runs fn() once for every instruction set the machine has (MLA's key loops have their own
// register tiles per set), then restores the one in use.
template <class Fn>
void ForEachIsa(const Fn& fn) {
  const Isa saved = MatMulIsa();
  for (const Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    SCOPED_TRACE(IsaName(isa));
    fn();
  }
  SetMatMulIsa(saved);
}

// The latent attention over hundreds of keys (several key chunks, folded in order; at one token
// the chunks are spread over the threads) against float64. Bound: each score sums up to 192 fp32
// products of values in [-1, 1] (a relative error near 1e-6), and each output is a convex
// combination of cache values in [-1, 1]; 1e-5 absolute covers both with room.
TEST(Mla, LatentAttentionOverManyChunksMatchesDouble) {
  struct Dims {
    int64_t heads, rank, rope, keys, tokens;
  };
  // The last: a fresh 160-token prompt (rows cut into parts of equal work under the causal mask).
  for (const Dims d :
       {Dims{4, 128, 64, 700, 1}, Dims{4, 128, 64, 700, 7}, Dims{3, 40, 10, 300, 1},
        Dims{4, 64, 16, 129, 2}, Dims{8, 64, 16, 300, 3}, Dims{4, 64, 16, 160, 160}}) {
    const int64_t width = d.rank + d.rope, first_pos = d.keys - d.tokens;
    LatentCache cache(d.keys, width, 11);
    const auto qa = testing::RandomVector(d.tokens * d.heads * width, 12, -0.5f, 0.5f);
    const float scale = 0.125f;
    std::vector<double> want(d.tokens * d.heads * d.rank, 0.0);
    for (int64_t row = 0; row < d.tokens * d.heads; ++row) {
      const int64_t visible = first_pos + row / d.heads + 1;
      std::vector<double> p(visible);
      double mx = -1e300, den = 0.0;
      for (int64_t s = 0; s < visible; ++s) {
        double acc = 0.0;
        for (int64_t c = 0; c < width; ++c) {
          acc += double{qa[row * width + c]} * cache.rows[s * width + c];
        }
        p[s] = acc * scale;
        mx = std::max(mx, p[s]);
      }
      for (double& v : p) den += (v = std::exp(v - mx));
      for (int64_t c = 0; c < d.rank; ++c) {
        for (int64_t s = 0; s < visible; ++s) {
          want[row * d.rank + c] += p[s] / den * cache.rows[s * width + c];
        }
      }
    }
    ForEachIsa([&] {
      std::vector<float> out(d.tokens * d.heads * d.rank);
      MlaLatentAttention(out.data(), qa.data(), d.tokens, first_pos, cache.View(), d.heads, d.rank,
                         d.rope, scale);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], 1e-5) << "heads " << d.heads << " keys " << d.keys << " row "
                                           << i / d.rank << " column " << i % d.rank;
      }
    });
  }
}

// A row's result depends only on its query and the cache rows it sees: tokens attended together
// (rows shared out over the threads) give the same bits as each token alone (keys shared out), on
// every thread count.
TEST(Mla, LatentAttentionRowIsTheSameAloneOrInABatch) {
  const int64_t heads = 4, rank = 128, rope = 64, width = rank + rope, keys = 600, T = 9;
  const int64_t first_pos = keys - T;
  LatentCache cache(keys, width, 21);
  const auto qa = testing::RandomVector(T * heads * width, 22, -0.5f, 0.5f);
  ForEachIsa([&] {
    std::vector<float> together(T * heads * rank), alone(heads * rank);
    MlaLatentAttention(together.data(), qa.data(), T, first_pos, cache.View(), heads, rank, rope,
                       0.1f);
    for (int threads : {1, 2, 3}) {
      ThreadPool::Global().SetActiveThreads(std::min(threads, ThreadPool::Global().num_threads()));
      for (int64_t t = 0; t < T; ++t) {
        MlaLatentAttention(alone.data(), qa.data() + t * heads * width, 1, first_pos + t,
                           cache.View(), heads, rank, rope, 0.1f);
        for (int64_t i = 0; i < heads * rank; ++i) {
          ASSERT_EQ(alone[i], together[t * heads * rank + i])
              << "token " << t << " threads " << threads;
        }
      }
    }
    ThreadPool::Global().SetActiveThreads(0);
  });
}

}  // namespace
}  // namespace kimi::cpu
