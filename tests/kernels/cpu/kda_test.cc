#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/test_util.h"

namespace kimi::cpu {
namespace {

struct Inputs {
  KdaDims d;
  std::vector<float> q, k, v, g, beta, state;
};

// Realistic inputs: q, k unit-norm per head (the model L2-normalises them), beta in (0, 1), log
// decays in [-decay_max, 0].
Inputs MakeInputs(int64_t T, int64_t H, int64_t K, int64_t V, uint32_t seed, float decay_max) {
  Inputs in;
  in.d = {T, H, K, V};
  in.q = testing::RandomVector(T * H * K, seed);
  in.k = testing::RandomVector(T * H * K, seed + 1);
  L2Norm(in.q.data(), T * H, K, 1e-6f);
  L2Norm(in.k.data(), T * H, K, 1e-6f);
  in.v = testing::RandomVector(T * H * V, seed + 2);
  in.g = testing::RandomVector(T * H * K, seed + 3, -decay_max, 0.0f);
  in.beta = testing::RandomVector(T * H, seed + 4, 0.0f, 1.0f);
  in.state = testing::RandomVector(H * K * V, seed + 5, -0.5f, 0.5f);
  return in;
}

// The token-by-token definition in double (KIMI_LINEAR.md 3.1 step 6).
void Reference(const Inputs& in, float scale, std::vector<double>* o, std::vector<double>* state) {
  const auto [T, H, K, V] = in.d;
  o->assign(T * H * V, 0.0);
  state->assign(in.state.begin(), in.state.end());
  for (int64_t h = 0; h < H; ++h) {
    double* S = state->data() + h * K * V;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t qk = (t * H + h) * K, vv = (t * H + h) * V;
      for (int64_t i = 0; i < K; ++i) {
        for (int64_t j = 0; j < V; ++j) S[i * V + j] *= std::exp(static_cast<double>(in.g[qk + i]));
      }
      for (int64_t j = 0; j < V; ++j) {
        double kv = 0.0;
        for (int64_t i = 0; i < K; ++i) kv += S[i * V + j] * in.k[qk + i];
        const double u = in.beta[t * H + h] * (in.v[vv + j] - kv);
        for (int64_t i = 0; i < K; ++i) S[i * V + j] += in.k[qk + i] * u;
      }
      for (int64_t j = 0; j < V; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < K; ++i) acc += S[i * V + j] * in.q[qk + i] * scale;
        (*o)[vv + j] = acc;
      }
    }
  }
}

struct Case {
  int64_t T, H, K, V;
  float decay_max;
};

class KdaTest : public ::testing::TestWithParam<Case> {};

// fp32 against the double definition. Each output sums K products over states that themselves
// accumulate up to T updates of size O(1); 2e-4 absolute (+1e-4 relative) leaves room for
// fp32 rounding over T <= 200 steps with unit-norm keys, and is far below any wiring error.
TEST_P(KdaTest, BothFormsMatchTheDefinition) {
  const Case c = GetParam();
  const Inputs in = MakeInputs(c.T, c.H, c.K, c.V, 17, c.decay_max);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.K));
  std::vector<double> ref_o, ref_s;
  Reference(in, scale, &ref_o, &ref_s);
  std::vector<float> o(c.T * c.H * c.V), state = in.state;
  KdaRecurrent(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
               state.data(), in.d, scale);
  EXPECT_LE(testing::WorstRatio(o, ref_o, 2e-4, 1e-4), 1.0) << "recurrent";
  EXPECT_LE(testing::WorstRatio(state, ref_s, 2e-4, 1e-4), 1.0) << "recurrent";
  // The chunked form is built per instruction-set level (vector width and register tiles), and
  // takes any chunk size: 64 (the engine's), and sizes that are not multiples of the tiles.
  const Isa saved = MatMulIsa();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (!SetMatMulIsa(isa)) continue;
    for (int chunk : {64, 16, 24, 40}) {
      std::fill(o.begin(), o.end(), 0.0f);
      state = in.state;
      KdaChunk(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
               state.data(), in.d, scale, 0, chunk);
      EXPECT_LE(testing::WorstRatio(o, ref_o, 2e-4, 1e-4), 1.0) << IsaName(isa) << " " << chunk;
      EXPECT_LE(testing::WorstRatio(state, ref_s, 2e-4, 1e-4), 1.0) << IsaName(isa) << " " << chunk;
    }
  }
  SetMatMulIsa(saved);
}

INSTANTIATE_TEST_SUITE_P(Shapes, KdaTest,
                         ::testing::Values(Case{1, 2, 16, 16, 0.5f}, Case{5, 2, 16, 8, 0.5f},
                                           Case{64, 3, 32, 16, 0.2f}, Case{100, 2, 16, 24, 0.2f},
                                           Case{130, 2, 32, 32, 1.0f},
                                           // V = 128: the recurrence's register-resident form
                                           Case{9, 2, 32, 128, 0.5f}, Case{3, 1, 128, 128, 0.5f},
                                           // strong decay: exp(G) spans many orders in a chunk
                                           Case{70, 1, 16, 16, 8.0f},
                                           // widths off every vector and tile size
                                           Case{75, 2, 24, 40, 0.3f}));

// Splitting a sequence at multiples of the chunk size reproduces the whole run bit for bit; any
// split agrees within fp32 rounding.
TEST(Kda, ChunkSplitsOnTheGridAreBitExact) {
  const Inputs in = MakeInputs(200, 2, 16, 16, 3, 0.3f);
  const float scale = 0.25f;
  std::vector<float> whole(200 * 2 * 16), state_whole = in.state;
  KdaChunk(whole.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
           state_whole.data(), in.d, scale);
  for (std::vector<int64_t> split : {std::vector<int64_t>{64, 136}, {128, 64, 8}, {37, 100, 63}}) {
    const bool on_grid = split[0] % 64 == 0 && (split[0] + split[1]) % 64 == 0;
    std::vector<float> o(whole.size()), state = in.state;
    int64_t t0 = 0;
    for (int64_t n : split) {
      const KdaDims d{n, 2, 16, 16};
      const int64_t a = t0 * 2 * 16;
      KdaChunk(o.data() + a, in.q.data() + a, in.k.data() + a, in.v.data() + a, in.g.data() + a,
               in.beta.data() + t0 * 2, state.data(), d, scale, t0);
      t0 += n;
    }
    for (size_t i = 0; i < o.size(); ++i) {
      if (on_grid) {
        ASSERT_EQ(o[i], whole[i]) << i;
      } else {
        ASSERT_NEAR(o[i], whole[i], 1e-5) << i;
      }
    }
  }
}

// A prompt split before its last token (a one-token step takes KdaRecurrent) gives the bits of the
// whole run: the one-token chunk on the grid is the recurrent step. At 128 wide heads (the
// unrolled path) and an odd width.
TEST(Kda, OneTokenTailIsTheRecurrentStep) {
  for (const auto& [K, V] : {std::pair<int64_t, int64_t>{128, 128}, {24, 40}}) {
    const int64_t T = 129, H = 2;
    const Inputs in = MakeInputs(T, H, K, V, 7, 0.3f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(K));
    std::vector<float> whole(T * H * V), state_whole = in.state;
    KdaChunk(whole.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
             state_whole.data(), in.d, scale);
    for (const bool recurrent_tail : {true, false}) {
      std::vector<float> o(whole.size()), state = in.state;
      KdaChunk(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
               state.data(), {T - 1, H, K, V}, scale);
      const int64_t t = T - 1;
      const KdaDims one{1, H, K, V};
      float* ot = o.data() + t * H * V;
      const float *qt = in.q.data() + t * H * K, *kt = in.k.data() + t * H * K,
                  *vt = in.v.data() + t * H * V, *gt = in.g.data() + t * H * K,
                  *bt = in.beta.data() + t * H;
      if (recurrent_tail) {
        KdaRecurrent(ot, qt, kt, vt, gt, bt, state.data(), one, scale);
      } else {
        KdaChunk(ot, qt, kt, vt, gt, bt, state.data(), one, scale, t);
      }
      for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(o[i], whole[i]) << K << " " << i;
      for (size_t i = 0; i < state.size(); ++i)
        ASSERT_EQ(state[i], state_whole[i]) << K << " " << i;
    }
  }
}

// --- The state stored as bf16 between calls ---

// The state's rounding as kda.h defines it: nearest even (F32ToBf16), fp32 subnormals to the zero
// of their sign.
std::vector<uint16_t> ToBf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const bool subnormal = std::fpclassify(x[i]) == FP_SUBNORMAL;
    out[i] = F32ToBf16(subnormal ? std::copysign(0.0f, x[i]) : x[i]);
  }
  return out;
}
std::vector<float> Widened(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = Bf16ToF32(x[i]);
  return out;
}

// Row t's pointers of the inputs (token-major), and a one-token or c-token view of them.
struct At {
  const Inputs& in;
  int64_t t;
  const float* q() const { return in.q.data() + t * in.d.H * in.d.K; }
  const float* k() const { return in.k.data() + t * in.d.H * in.d.K; }
  const float* v() const { return in.v.data() + t * in.d.H * in.d.V; }
  const float* g() const { return in.g.data() + t * in.d.H * in.d.K; }
  const float* beta() const { return in.beta.data() + t * in.d.H; }
};

// The bf16 forms are defined as the fp32 ones on the widened state, rounded after each token
// (KdaRecurrent) or each chunk on the grid (KdaChunk): equal bit for bit, at the register-resident
// width (128) and an odd one, from a start on the grid and off it. Three heads: on two threads one
// part holds two, whose states KdaChunk keeps widened side by side, chunk after chunk.
TEST(KdaBf16State, IsTheFp32StepRoundedAfterEachTokenOrChunk) {
  for (const auto& [K, V] : {std::pair<int64_t, int64_t>{128, 128}, {24, 40}}) {
    const int64_t T = 150, H = 3;
    const Inputs in = MakeInputs(T, H, K, V, 11, 0.3f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(K));
    const std::vector<uint16_t> start = ToBf16(in.state);
    // KdaRecurrent: token by token.
    std::vector<float> o(T * H * V), want_o(T * H * V);
    std::vector<uint16_t> state = start;
    KdaRecurrent(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                 state.data(), in.d, scale);
    std::vector<float> wide = Widened(start);
    for (int64_t t = 0; t < T; ++t) {
      const At a{in, t};
      KdaRecurrent(want_o.data() + t * H * V, a.q(), a.k(), a.v(), a.g(), a.beta(), wide.data(),
                   {1, H, K, V}, scale);
      wide = Widened(ToBf16(wide));
    }
    ASSERT_EQ(o, want_o) << K;
    ASSERT_EQ(state, ToBf16(wide)) << K;
    // KdaChunk: chunk by chunk on the grid, from 5 tokens in (a first chunk of 59, then 64, then
    // 27) and from 63 in (a one-token first chunk, the recurrent step).
    for (const int64_t pos0 : {5, 63}) {
      std::fill(o.begin(), o.end(), 0.0f);
      state = start;
      KdaChunk(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
               state.data(), in.d, scale, pos0);
      wide = Widened(start);
      for (int64_t t = 0; t < T;) {
        const int64_t c = std::min<int64_t>(64 - (pos0 + t) % 64, T - t);
        const At a{in, t};
        KdaChunk(want_o.data() + t * H * V, a.q(), a.k(), a.v(), a.g(), a.beta(), wide.data(),
                 {c, H, K, V}, scale, pos0 + t);
        wide = Widened(ToBf16(wide));
        t += c;
      }
      ASSERT_EQ(o, want_o) << K << " " << pos0;
      ASSERT_EQ(state, ToBf16(wide)) << K << " " << pos0;
    }
  }
}

// As with the fp32 state: a prompt split on the grid, or before its last token (which the
// recurrent step then takes), gives the whole run's bits.
TEST(KdaBf16State, GridSplitsAndOneTokenTailsAreBitExact) {
  const int64_t T = 129, H = 2, K = 128, V = 128;
  const Inputs in = MakeInputs(T, H, K, V, 13, 0.3f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(K));
  std::vector<float> whole(T * H * V);
  std::vector<uint16_t> state_whole = ToBf16(in.state);
  KdaChunk(whole.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
           state_whole.data(), in.d, scale);
  for (const std::vector<int64_t>& split : {std::vector<int64_t>{64, 65}, {128, 1}, {64, 64, 1}}) {
    std::vector<float> o(whole.size());
    std::vector<uint16_t> state = ToBf16(in.state);
    int64_t t0 = 0;
    for (const int64_t n : split) {
      const At a{in, t0};
      float* ot = o.data() + t0 * H * V;
      if (n == 1) {
        KdaRecurrent(ot, a.q(), a.k(), a.v(), a.g(), a.beta(), state.data(), {1, H, K, V}, scale);
      } else {
        KdaChunk(ot, a.q(), a.k(), a.v(), a.g(), a.beta(), state.data(), {n, H, K, V}, scale, t0);
      }
      t0 += n;
    }
    ASSERT_EQ(o, whole) << split.size();
    ASSERT_EQ(state, state_whole) << split.size();
  }
}

// Against the double definition (the fp32 state's test above allows 2e-4 + 1e-4 relative). bf16
// keeps 8 significant bits: each rounding moves a state entry by at most 2^-9 of itself, and the
// decay and the delta rule's (I - beta k k^T) carry the error forward without growing it, so
// after n roundings an entry is off by about sqrt(n) 2^-9 |S| when the roundings' signs are
// random (2.4e-2 |S| at n = 150; n 2^-9 |S| if they all agreed). KdaRecurrent rounds after every
// token, KdaChunk after every chunk. States here are O(1) (a start in [-0.5, 0.5], unit-norm
// keys): 3e-2 absolute + 3e-2 relative for the state, 1e-2 + 1e-2 for the outputs, which average
// the state's errors over a row of q. Observed worst ratios over these shapes: 0.22 (state, slow
// decay, token by token), 0.05 (outputs); a state not written back or a wrong row is off by
// O(0.1-1).
TEST(KdaBf16State, StaysCloseToTheDefinition) {
  for (const Case c :
       {Case{64, 2, 128, 128, 0.05f}, Case{150, 2, 128, 128, 0.5f}, Case{100, 2, 24, 40, 0.2f}}) {
    const Inputs in = MakeInputs(c.T, c.H, c.K, c.V, 19, c.decay_max);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.K));
    std::vector<double> ref_o, ref_s;
    Reference(in, scale, &ref_o, &ref_s);
    for (const bool chunked : {false, true}) {
      std::vector<float> o(c.T * c.H * c.V);
      std::vector<uint16_t> state = ToBf16(in.state);
      if (chunked) {
        KdaChunk(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                 state.data(), in.d, scale);
      } else {
        KdaRecurrent(o.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                     state.data(), in.d, scale);
      }
      EXPECT_LE(testing::WorstRatio(o, ref_o, 1e-2, 1e-2), 1.0) << c.T << " " << chunked;
      EXPECT_LE(testing::WorstRatio(Widened(state), ref_s, 3e-2, 3e-2), 1.0)
          << c.T << " " << chunked;
    }
  }
}

// Kimi Linear's gate: -exp(A_log) * softplus(x + dt_bias) with softplus's threshold at 20; K3's:
// lower_bound * sigmoid(exp(A_log) * (x + dt_bias)).
TEST(Kda, GateForms) {
  const int64_t T = 3, H = 2, K = 4;
  const std::vector<float> raw = {-30, -1, 0, 1, 2, 19, 21, 50, -3, 3, 0.5, -0.5,
                                  1,   2,  3, 4, 5, 6,  7,  8,  9,  10, -5,  -6,
                                  0,   0,  0, 0, 1, 1,  1,  1,  -1, -1, -1,  -1};
  const std::vector<float> a_log = {0.3f, -0.7f};
  const std::vector<float> dt = {0.1f, -0.2f, 0.3f, 0.0f, 1.0f, -1.0f, 0.5f, 2.0f};
  std::vector<float> g(T * H * K);
  KdaGate(g.data(), raw.data(), T, H, K, a_log.data(), dt.data(), std::nullopt);
  for (int64_t i = 0; i < T * H * K; ++i) {
    const int64_t h = (i / K) % H;
    const double z = static_cast<double>(raw[i]) + dt[h * K + i % K];
    const double sp = z > 20.0 ? z : std::log1p(std::exp(z));
    EXPECT_NEAR(g[i], -std::exp(static_cast<double>(a_log[h])) * sp, 1e-5 * (1 + std::fabs(sp)));
  }
  KdaGate(g.data(), raw.data(), T, H, K, a_log.data(), dt.data(), -5.0f);
  for (int64_t i = 0; i < T * H * K; ++i) {
    const int64_t h = (i / K) % H;
    const double z = static_cast<double>(raw[i]) + dt[h * K + i % K];
    const double want = -5.0 / (1.0 + std::exp(-std::exp(static_cast<double>(a_log[h])) * z));
    EXPECT_NEAR(g[i], want, 1e-5);
    EXPECT_LE(g[i], 0.0f);
    EXPECT_GE(g[i], -5.0f);
  }
}

}  // namespace
}  // namespace kimi::cpu
