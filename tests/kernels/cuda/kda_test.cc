// The KDA kernels (conv, gate, fused decode, chunked prefill) against kernels/cpu.
#include <cmath>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/causal_conv.h"
#include "kernels/cpu/kda.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/causal_conv.h"
#include "kernels/cuda/kda_chunk.h"
#include "kernels/cuda/kda_decode.h"
#include "kernels/cuda/kda_gate.h"
#include "tests/kernels/cpu/test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kimi::cuda {
namespace {

using testing::DeviceBatchOf;
using testing::DeviceVector;
using testing::HostSeq;
using kimi::testing::RandomVector;

// Conv + SiLU: the same W products in the same order on both sides; only FMA contraction may
// differ, so 1e-6 relative plus 1e-6 absolute.
TEST(CudaKda, CausalConvMatchesCpuPerSequence) {
  KIMI_REQUIRE_GPU();
  const int64_t C = 48, stride = 3 * C + 7;
  const int W = 4;
  const std::vector<HostSeq> seqs = {{5, 0, 1, {}}, {1, 9, 2, {}}, {2, 3, 0, {}}, {4, 0, -1, {}}};
  const int64_t T = 12;
  const auto x = RandomVector(T * C, 1, -2.0f, 2.0f);
  const auto w = RandomVector(C * W, 2);
  auto state = RandomVector(3 * stride, 3);
  std::vector<float> want(T * C, 5.0f), want_state = state;
  int64_t off = 0;
  for (const HostSeq& s : seqs) {
    if (s.count >= 2 && s.slot >= 0) {
      kimi::cpu::CausalConv1dSilu(&want[off * C], C, &x[off * C], C, s.count, C, w.data(), W,
                                  &want_state[s.slot * stride]);
    }
    off += s.count;
  }
  DeviceBatchOf b(seqs);
  DeviceVector<float> dx(x), dw(w), ds(state), dy(std::vector<float>(T * C, 5.0f));
  ASSERT_TRUE(CausalConvSilu(dy.get(), C, ds.get(), stride, dx.get(), C, dw.get(), W, C, b.batch,
                             /*min_count=*/2, nullptr)
                  .ok());
  testing::Sync();
  EXPECT_LE(testing::WorstRatio(dy.Host(), want, {}, 1e-6, 1e-6), 1.0);  // skipped rows stay 5
  EXPECT_EQ(ds.Host(), want_state);  // the history holds inputs, copied: exact
}

// expf/log1pf against libm: 1e-6 relative plus 1e-6 absolute.
TEST(CudaKda, GateMatchesCpu) {
  KIMI_REQUIRE_GPU();
  const int64_t T = 3, H = 4, K = 16;
  const auto raw = RandomVector(T * H * K, 4, -30.0f, 30.0f);
  const auto a_log = RandomVector(H, 5, -1.0f, 1.0f);
  const auto dt = RandomVector(H * K, 6);
  for (const std::optional<float> lb : {std::optional<float>(), std::optional<float>(-5.0f)}) {
    std::vector<float> want(raw.size());
    kimi::cpu::KdaGate(want.data(), raw.data(), T, H, K, a_log.data(), dt.data(), lb);
    DeviceVector<float> dr(raw), da(a_log), dd(dt), dg(raw.size());
    ASSERT_TRUE(KdaGate(dg.get(), dr.get(), da.get(), dd.get(), lb, T, H, K, nullptr).ok());
    testing::Sync();
    EXPECT_LE(testing::WorstRatio(dg.Host(), want, {}, 1e-6, 1e-6), 1.0) << lb.has_value();
  }
}

// The fused decode kernel against the CPU's separate steps (conv, L2 norm, gate, sigmoid,
// KdaRecurrent, RMSNorm, sigmoid gate). fp32 both sides, sums of K products in another order:
// 2e-5 relative plus 2e-5 absolute on outputs of O(1) and on the state.
TEST(CudaKda, FusedDecodeMatchesCpuSteps) {
  KIMI_REQUIRE_GPU();
  for (const int64_t K : {32, 128}) {
    for (const std::optional<float> lb : {std::optional<float>(), std::optional<float>(-5.0f)}) {
      const int64_t H = 3, V = K, P = H * K;
      const int W = 4;
      const int64_t rec = H * K * V, per = rec + 3 * (W - 1) * P, slots = 3;
      // Decode in slot 2, a prefill sequence (skipped), padding, decode in slot 1.
      const std::vector<HostSeq> seqs = {{1, 7, 2, {}}, {3, 0, 0, {}}, {1, 0, -1, {}}, {1, 2, 1, {}}};
      const int64_t T = 6;
      const auto q = RandomVector(T * P, 10), k = RandomVector(T * P, 11), v = RandomVector(T * P, 12);
      const auto g_raw = RandomVector(T * P, 13, -3.0f, 3.0f);
      const auto beta_raw = RandomVector(T * H, 14, -3.0f, 3.0f);
      const auto gate = RandomVector(T * P, 15, -3.0f, 3.0f);
      const auto cq = RandomVector(P * W, 16), ck = RandomVector(P * W, 17), cv = RandomVector(P * W, 18);
      const auto a_log = RandomVector(H, 19, -1.0f, 0.5f);
      const auto dt = RandomVector(P, 20);
      const auto o_norm = RandomVector(V, 21, 0.5f, 1.5f);
      const auto state = RandomVector(slots * per, 22, -0.5f, 0.5f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(K));

      std::vector<float> want(T * P, 3.0f), want_state = state;
      int64_t off = 0;
      for (const HostSeq& s : seqs) {
        const int64_t t = off;
        off += s.count;
        if (s.count != 1) continue;
        if (s.slot < 0) {
          std::fill_n(&want[t * P], P, 0.0f);
          continue;
        }
        float* st = &want_state[s.slot * per];
        std::vector<float> qq(P), kk(P), vv(P), gg(P), bb(H), o(P);
        const float* raw[3] = {&q[t * P], &k[t * P], &v[t * P]};
        const float* taps[3] = {cq.data(), ck.data(), cv.data()};
        float* outs[3] = {qq.data(), kk.data(), vv.data()};
        for (int i = 0; i < 3; ++i) {
          kimi::cpu::CausalConv1dSilu(outs[i], P, raw[i], P, 1, P, taps[i], W, st + rec + i * (W - 1) * P);
        }
        kimi::cpu::L2Norm(qq.data(), H, K, 1e-6f);
        kimi::cpu::L2Norm(kk.data(), H, K, 1e-6f);
        kimi::cpu::KdaGate(gg.data(), &g_raw[t * P], 1, H, K, a_log.data(), dt.data(), lb);
        std::copy_n(&beta_raw[t * H], H, bb.data());
        kimi::cpu::SigmoidInPlace(bb.data(), H);
        kimi::cpu::KdaRecurrent(o.data(), qq.data(), kk.data(), vv.data(), gg.data(), bb.data(), st,
                                {1, H, K, V}, scale);
        kimi::cpu::RmsNorm(o.data(), o.data(), o_norm.data(), H, K, 1e-5f);
        kimi::cpu::MulSigmoid(o.data(), &gate[t * P], P);
        std::copy(o.begin(), o.end(), &want[t * P]);
      }

      DeviceBatchOf b(seqs);
      DeviceVector<float> dq(q), dk(k), dv(v), dgr(g_raw), dbr(beta_raw), dgate(gate), dcq(cq),
          dck(ck), dcv(cv), dal(a_log), ddt(dt), dnorm(o_norm), dst(state),
          dout(std::vector<float>(T * P, 3.0f));
      KdaDecodeArgs a;
      a.o = dout.get();
      a.state = dst.get();
      a.slot_stride = per;
      a.conv_offset = rec;
      a.q_raw = dq.get();
      a.k_raw = dk.get();
      a.v_raw = dv.get();
      a.ld_qkv = P;
      a.g_raw = dgr.get();
      a.beta_raw = dbr.get();
      a.gate = dgate.get();
      a.conv_q = dcq.get();
      a.conv_k = dck.get();
      a.conv_v = dcv.get();
      a.a_log = dal.get();
      a.dt_bias = ddt.get();
      a.o_norm = dnorm.get();
      a.has_lower_bound = lb.has_value();
      a.lower_bound = lb.value_or(0.0f);
      a.H = H;
      a.K = K;
      a.V = V;
      a.W = W;
      a.scale = scale;
      a.norm_eps = 1e-5f;
      ASSERT_TRUE(KdaDecode(a, b.batch, nullptr).ok());
      testing::Sync();
      EXPECT_LE(testing::WorstRatio(dout.Host(), want, {}, 2e-5, 2e-5), 1.0) << K << " " << lb.has_value();
      EXPECT_LE(testing::WorstRatio(dst.Host(), want_state, {}, 2e-5, 2e-5), 1.0) << K;
    }
  }
}

// Chunked prefill against the CPU's KdaChunk, per sequence, with chunks on the absolute 64-token
// grid (pos0 not a multiple of 64). Both are fp32 forms of the same recurrence with different
// summation orders (the CPU factorises the pairwise exps over sub-chunks); the CPU's own test
// holds each within 2e-4 absolute + 1e-4 relative of a float64 reference, so 4e-4 + 2e-4 here.
TEST(CudaKda, ChunkMatchesCpu) {
  KIMI_REQUIRE_GPU();
  for (const int64_t K : {32, 128}) {
    const int64_t H = 2, V = K, slots = 3;
    const std::vector<HostSeq> seqs = {{150, 10, 1, {}}, {1, 4, 0, {}}, {70, 0, 2, {}}, {5, 0, -1, {}}};
    const int64_t T = 226;
    auto q = RandomVector(T * H * K, 30), k = RandomVector(T * H * K, 31);
    kimi::cpu::L2Norm(q.data(), T * H, K, 1e-6f);
    kimi::cpu::L2Norm(k.data(), T * H, K, 1e-6f);
    const auto v = RandomVector(T * H * V, 32);
    const auto g = RandomVector(T * H * K, 33, -0.5f, 0.0f);
    const auto beta = RandomVector(T * H, 34, 0.0f, 1.0f);
    const auto state = RandomVector(slots * H * K * V, 35, -0.5f, 0.5f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(K));
    std::vector<float> want(T * H * V, 9.0f), want_state = state;
    int64_t off = 0;
    for (const HostSeq& s : seqs) {
      if (s.count >= 2 && s.slot >= 0) {
        kimi::cpu::KdaChunk(&want[off * H * V], &q[off * H * K], &k[off * H * K], &v[off * H * V],
                            &g[off * H * K], &beta[off * H], &want_state[s.slot * H * K * V],
                            {s.count, H, K, V}, scale, s.pos0);
      }
      off += s.count;
    }
    DeviceBatchOf b(seqs);
    const int64_t ws = KdaChunkWorkspaceFloats(H, K, V, 64, 2);  // 2 lanes for 3 sequences
    DeviceVector<float> dq(q), dk(k), dv(v), dg(g), dbeta(beta), dst(state),
        dout(std::vector<float>(T * H * V, 9.0f)), dws(ws);
    KdaChunkArgs a;
    a.o = dout.get();
    a.state = dst.get();
    a.slot_stride = H * K * V;
    a.q = dq.get();
    a.k = dk.get();
    a.v = dv.get();
    a.g = dg.get();
    a.beta = dbeta.get();
    a.H = H;
    a.K = K;
    a.V = V;
    a.scale = scale;
    a.workspace = dws.get();
    a.workspace_floats = ws;
    ASSERT_TRUE(KdaChunk(a, b.batch, /*min_count=*/2, nullptr).ok());
    testing::Sync();
    EXPECT_LE(testing::WorstRatio(dout.Host(), want, {}, 4e-4, 2e-4), 1.0) << K;
    EXPECT_LE(testing::WorstRatio(dst.Host(), want_state, {}, 4e-4, 2e-4), 1.0) << K;
  }
}

TEST(CudaKda, RejectsBadShapes) {
  KdaDecodeArgs a;
  a.H = 1;
  a.K = 64;
  a.V = 32;
  EXPECT_FALSE(KdaDecode(a, DeviceBatch{}, nullptr).ok());
  KdaChunkArgs c;
  c.H = c.K = c.V = 16;
  c.workspace_floats = 10;
  DeviceBatch b;
  b.num_seqs = 1;
  EXPECT_FALSE(KdaChunk(c, b, 2, nullptr).ok());
}

}  // namespace
}  // namespace kimi::cuda
