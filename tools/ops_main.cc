// kimi-ops OP --in IN.safetensors --out OUT.safetensors [--mode M]
// Runs one CPU kernel on named input tensors and writes named fp32 outputs, so that each kernel can
// be compared with an outside reference (PyTorch, fla). The op table is in ../shared/DESIGN.md.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/sublayers.h"
#include "kernels/cpu/ops.h"
#include "tools/parse_flags.h"
#include "tools/tensor_io.h"

ABSL_FLAG(std::string, in, "", "input .safetensors with the op's named tensors");
ABSL_FLAG(std::string, out, "", "output .safetensors for the op's named results (fp32)");
ABSL_FLAG(std::string, mode, "", "op variant: kda takes chunk (default) or recurrent");

namespace kimi::tools {
namespace {

using OpFn = std::function<absl::Status(const TensorMap&, TensorMap&)>;

#define KIMI_NEED(var, name, rank)                   \
  auto var##_or = Need(in, name, rank);              \
  if (!var##_or.ok()) return var##_or.status();      \
  const HostTensor& var = **var##_or;

absl::Status ShapeError(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status Kda(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(q, "q", 4);
  KIMI_NEED(k, "k", 4);
  KIMI_NEED(v, "v", 4);
  KIMI_NEED(g, "g", 4);
  KIMI_NEED(beta, "beta", 3);
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3], V = v.shape[3];
  if (k.shape != q.shape || g.shape != q.shape ||
      v.shape != std::vector<int64_t>{B, T, H, V} || beta.shape != std::vector<int64_t>{B, T, H}) {
    return ShapeError("kda: shapes must be q,k,g [B,T,H,K], v [B,T,H,V], beta [B,T,H]");
  }
  const std::string mode = absl::GetFlag(FLAGS_mode).empty() ? "chunk" : absl::GetFlag(FLAGS_mode);
  if (mode != "chunk" && mode != "recurrent") {
    return absl::InvalidArgumentError("kda: --mode must be chunk or recurrent");
  }
  HostTensor o = F32({B, T, H, V});
  HostTensor state = F32({B, H, K, V});
  if (auto it = in.find("initial_state"); it != in.end()) {
    if (it->second.shape != state.shape) return ShapeError("kda: initial_state must be [B,H,K,V]");
    state.f32 = it->second.f32;
  }
  const float scale = ScalarOr(in, "scale", 1.0f / std::sqrt(static_cast<float>(K)));
  for (int64_t b = 0; b < B; ++b) {
    const cpu::KdaDims d{T, H, K, V};
    const int64_t qk = b * T * H * K, vv = b * T * H * V;
    float* s = state.f32.data() + b * H * K * V;
    if (mode == "recurrent") {
      cpu::KdaRecurrent(o.f32.data() + vv, q.f32.data() + qk, k.f32.data() + qk, v.f32.data() + vv,
                        g.f32.data() + qk, beta.f32.data() + b * T * H, s, d, scale);
    } else {
      cpu::KdaChunk(o.f32.data() + vv, q.f32.data() + qk, k.f32.data() + qk, v.f32.data() + vv,
                    g.f32.data() + qk, beta.f32.data() + b * T * H, s, d, scale);
    }
  }
  out["o"] = std::move(o);
  out["final_state"] = std::move(state);
  return absl::OkStatus();
}

absl::Status KdaGate(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(raw, "g_raw", 3);
  KIMI_NEED(a_log, "A_log", 1);
  KIMI_NEED(dt_bias, "dt_bias", 1);
  const int64_t T = raw.shape[0], H = raw.shape[1], K = raw.shape[2];
  if (a_log.shape[0] < H || dt_bias.shape[0] != H * K) {
    return ShapeError("kda_gate: A_log must have >= H entries and dt_bias H*K");
  }
  std::optional<float> lb;
  if (in.count("lower_bound")) lb = ScalarOr(in, "lower_bound", 0.0f);
  HostTensor g = F32(raw.shape);
  cpu::KdaGate(g.f32.data(), raw.f32.data(), T, H, K, a_log.f32.data(), dt_bias.f32.data(), lb);
  out["g"] = std::move(g);
  return absl::OkStatus();
}

absl::Status RmsNorm(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(x, "x", 2);
  KIMI_NEED(w, "weight", 1);
  if (w.shape[0] != x.shape[1]) return ShapeError("rmsnorm: weight must be [H] for x [N,H]");
  HostTensor o = F32(x.shape);
  cpu::RmsNorm(o.f32.data(), x.f32.data(), w.f32.data(), x.shape[0], x.shape[1],
               ScalarOr(in, "eps", 1e-5f));
  out["out"] = std::move(o);
  return absl::OkStatus();
}

absl::Status Situ(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(gate, "gate", 2);
  KIMI_NEED(up, "up", 2);
  if (gate.shape != up.shape) return ShapeError("situ: gate and up must have the same shape");
  HostTensor o = F32(gate.shape);
  cpu::SituGlu(o.f32.data(), gate.f32.data(), up.f32.data(), gate.numel(),
               ScalarOr(in, "beta", 4.0f), ScalarOr(in, "linear_beta", 25.0f));
  out["out"] = std::move(o);
  return absl::OkStatus();
}

absl::Status AttnRes(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(bank, "bank", 3);
  KIMI_NEED(partial, "partial", 2);
  KIMI_NEED(norm_w, "norm_weight", 1);
  KIMI_NEED(proj_w, "proj_weight", 2);
  const int64_t T = bank.shape[0], NB = bank.shape[1], H = bank.shape[2];
  if (partial.shape != std::vector<int64_t>{T, H} || norm_w.shape[0] != H ||
      proj_w.shape != std::vector<int64_t>{1, H}) {
    return ShapeError("attn_res: bank [T,NB,H], partial [T,H], norm_weight [H], proj_weight [1,H]");
  }
  std::vector<float> w(H);
  for (int64_t i = 0; i < H; ++i) w[i] = norm_w.f32[i] * proj_w.f32[i];
  HostTensor o = F32({T, H});
  HostTensor probs = F32({T, NB + 1});
  cpu::AttnRes(o.f32.data(), probs.f32.data(), bank.f32.data(), NB * H, NB, partial.f32.data(),
               w.data(), T, H, ScalarOr(in, "eps", 1e-5f));
  out["out"] = std::move(o);
  out["probs"] = std::move(probs);
  return absl::OkStatus();
}

absl::Status MoeRoute(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(logits, "logits", 2);
  KIMI_NEED(bias, "bias", 1);
  const int64_t T = logits.shape[0], E = logits.shape[1];
  const int64_t k = static_cast<int64_t>(ScalarOr(in, "top_k", 0.0f));
  if (bias.shape[0] != E) return ShapeError("moe_route: bias must be [E]");
  if (k <= 0 || k > E) return absl::InvalidArgumentError("moe_route: top_k must be in [1, E]");
  cpu::MoeRouteParams p;
  p.num_experts = E;
  p.top_k = k;
  p.num_groups = static_cast<int64_t>(ScalarOr(in, "num_groups", 1.0f));
  p.topk_groups = static_cast<int64_t>(ScalarOr(in, "topk_groups", 1.0f));
  p.renormalize = ScalarOr(in, "renormalize", 1.0f) != 0.0f;
  p.scaling = ScalarOr(in, "scaling", 1.0f);
  if (p.num_groups < 1 || E % p.num_groups != 0 || p.topk_groups < 1 ||
      p.topk_groups > p.num_groups) {
    return absl::InvalidArgumentError("moe_route: num_groups must divide E, topk_groups <= it");
  }
  HostTensor ids;
  ids.shape = {T, k};
  ids.i32.assign(T * k, 0);
  HostTensor w = F32({T, k});
  cpu::MoeRoute(ids.i32.data(), w.f32.data(), logits.f32.data(), bias.f32.data(), T, p);
  out["ids"] = std::move(ids);
  out["weights"] = std::move(w);
  return absl::OkStatus();
}

absl::Status Mxfp4MatMul(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(x, "x", 2);
  KIMI_NEED(packed, "weight_packed", 2);
  KIMI_NEED(scale, "weight_scale", 2);
  const int64_t T = x.shape[0], K = x.shape[1], N = packed.shape[0];
  if (packed.u8.empty() || scale.u8.empty()) {
    return ShapeError("mxfp4_matmul: weight_packed and weight_scale must be U8");
  }
  if (K % 32 != 0 || packed.shape[1] != K / 2 || scale.shape != std::vector<int64_t>{N, K / 32}) {
    return ShapeError("mxfp4_matmul: x [T,K] (K % 32 == 0), weight_packed [N,K/2], "
                      "weight_scale [N,K/32]");
  }
  Weight w;
  w.data = packed.u8.data();
  w.scales = scale.u8.data();
  w.format = WeightFormat::kMxfp4;
  w.rows = N;
  w.cols = K;
  HostTensor o = F32({T, N});
  cpu::MatMul(o.f32.data(), x.f32.data(), w, T);
  out["out"] = std::move(o);
  return absl::OkStatus();
}

absl::Status Mla(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(q, "q", 3);
  KIMI_NEED(latent, "kv_latent", 2);
  KIMI_NEED(k_pe, "k_pe", 2);
  KIMI_NEED(w_kv_b, "w_kv_b", 2);
  const int64_t T = q.shape[0], Hh = q.shape[1], Dqk = q.shape[2];
  const int64_t S = latent.shape[0], R = latent.shape[1], Dr = k_pe.shape[1];
  const int64_t Dn = Dqk - Dr;
  // Hh first: the checks after it divide by it (q with no heads ended in SIGFPE). R > 0 as the
  // config requires of kv_lora_rank: the kernel indexed an empty latent row.
  if (Hh <= 0 || R <= 0 || k_pe.shape[0] != S || T > S || Dn <= 0 || w_kv_b.shape[1] != R ||
      w_kv_b.shape[0] % Hh != 0 || w_kv_b.shape[0] / Hh <= Dn) {
    return ShapeError("mla: q [T,Hh,Dn+Dr], kv_latent [S,R], k_pe [S,Dr], "
                      "w_kv_b [Hh*(Dn+Dv),R], T <= S");
  }
  const int64_t Dv = w_kv_b.shape[0] / Hh - Dn;
  // The cache as one page holding all S rows of [latent | k_pe].
  std::vector<float> pool(S * (R + Dr));
  for (int64_t s = 0; s < S; ++s) {
    // Pointer arithmetic, not operator[]: with R or Dr 0 the source vector is empty, and indexing
    // it is undefined (UBSan: reference binding to null pointer) even for a copy of nothing.
    std::copy_n(latent.f32.data() + s * R, R, pool.data() + s * (R + Dr));
    std::copy_n(k_pe.f32.data() + s * Dr, Dr, pool.data() + s * (R + Dr) + R);
  }
  const int32_t page = 0;
  const PagedRows rows{pool.data(), &page, S, R + Dr};
  Weight w;
  w.data = w_kv_b.f32.data();
  w.format = WeightFormat::kF32;
  w.rows = w_kv_b.shape[0];
  w.cols = R;
  HostTensor o = F32({T, Hh, Dv});
  cpu::MlaAttention(o.f32.data(), q.f32.data(), T, S - T, rows, w, {Hh, Dn, Dr, Dv, R},
                    ScalarOr(in, "scale", 1.0f / std::sqrt(static_cast<float>(Dqk))));
  out["out"] = std::move(o);
  return absl::OkStatus();
}

// K3's Latent MoE sublayer: router on x, routed experts (MXFP4, SiTU-GLU) in the latent, combine,
// latent RMSNorm, up-projection, plus optional shared experts on x.
absl::Status LatentMoe(const TensorMap& in, TensorMap& out) {
  KIMI_NEED(x, "x", 2);
  KIMI_NEED(gate, "gate", 2);
  KIMI_NEED(bias, "bias", 1);
  KIMI_NEED(down, "down", 2);
  KIMI_NEED(up, "up", 2);
  const int64_t T = x.shape[0], H = x.shape[1], E = gate.shape[0], L = down.shape[0];
  if (gate.shape[1] != H || bias.shape[0] != E || down.shape[1] != H ||
      up.shape != std::vector<int64_t>{H, L}) {
    return ShapeError("latent_moe: x [T,H], gate [E,H], bias [E], down [L,H], up [H,L]");
  }
  const HostTensor* packed[3];
  const HostTensor* scales[3];
  const char* names[3] = {"w1", "w3", "w2"};
  for (int i = 0; i < 3; ++i) {
    auto p = Need(in, std::string(names[i]) + "_packed", 3);
    auto s = Need(in, std::string(names[i]) + "_scale", 3);
    if (!p.ok()) return p.status();
    if (!s.ok()) return s.status();
    packed[i] = *p;
    scales[i] = *s;
    if (packed[i]->u8.empty() || scales[i]->u8.empty() || packed[i]->shape[0] != E) {
      return ShapeError(absl::StrCat("latent_moe: ", names[i], "_packed/_scale must be U8 [E,...]"));
    }
  }
  const int64_t I = packed[0]->shape[1];
  // w1/w3 [E, I, L/2] + [E, I, L/32]; w2 [E, L, I/2] + [E, L, I/32].
  for (int i = 0; i < 3; ++i) {
    const int64_t rows = i < 2 ? I : L, cols = i < 2 ? L : I;
    if (cols % 32 != 0 || packed[i]->shape != std::vector<int64_t>{E, rows, cols / 2} ||
        scales[i]->shape != std::vector<int64_t>{E, rows, cols / 32}) {
      return ShapeError("latent_moe: w1/w3 packed [E,I,L/2] scale [E,I,L/32]; w2 packed "
                        "[E,L,I/2] scale [E,L,I/32]; L and I multiples of 32");
    }
  }
  ModelConfig c;
  c.hidden = H;
  c.rms_eps = ScalarOr(in, "eps", 1e-5f);
  c.activation = Activation::kSituGlu;
  c.situ_beta = ScalarOr(in, "beta", 4.0f);
  c.situ_linear_beta = ScalarOr(in, "linear_beta", 25.0f);
  c.moe.num_experts = E;
  c.moe.top_k = static_cast<int64_t>(ScalarOr(in, "top_k", 0.0f));
  c.moe.intermediate = I;
  c.moe.renormalize = ScalarOr(in, "renormalize", 1.0f) != 0.0f;
  c.moe.routed_scaling = ScalarOr(in, "scaling", 1.0f);
  c.moe.latent_dim = L;
  c.moe.mxfp4_experts = true;
  if (c.moe.top_k <= 0 || c.moe.top_k > E) return ShapeError("latent_moe: top_k in [1, E]");
  auto dense = [](const HostTensor& t) {
    Weight w;
    w.data = t.f32.data();
    w.format = WeightFormat::kF32;
    w.rows = t.shape[0];
    w.cols = t.shape[1];
    return w;
  };
  MoeWeights w;
  w.router = dense(gate);
  w.bias = bias.f32.data();
  w.latent_down = dense(down);
  w.latent_up = dense(up);
  if (auto it = in.find("norm"); it != in.end()) {
    if (it->second.shape != std::vector<int64_t>{L}) return ShapeError("latent_moe: norm [L]");
    c.moe.latent_norm = true;
    w.latent_norm = it->second.f32.data();
  }
  for (int64_t e = 0; e < E; ++e) {
    Weight m[3];
    for (int i = 0; i < 3; ++i) {
      const int64_t rows = i < 2 ? I : L, cols = i < 2 ? L : I;
      m[i].format = WeightFormat::kMxfp4;
      m[i].rows = rows;
      m[i].cols = cols;
      m[i].data = packed[i]->u8.data() + e * rows * (cols / 2);
      m[i].scales = scales[i]->u8.data() + e * rows * (cols / 32);
    }
    w.experts.push_back({m[0], m[1], m[2]});
  }
  if (in.count("shared_gate")) {
    KIMI_NEED(sg, "shared_gate", 2);
    KIMI_NEED(su, "shared_up", 2);
    KIMI_NEED(sd, "shared_down", 2);
    if (sg.shape[1] != H || su.shape != sg.shape || sd.shape != std::vector<int64_t>{H, sg.shape[0]}) {
      return ShapeError("latent_moe: shared_gate/up [S,H], shared_down [H,S]");
    }
    c.moe.num_shared = 1;
    w.shared = {dense(sg), dense(su), dense(sd)};
  }
  HostTensor o = F32({T, H});
  RunMoe(c, w, x.f32.data(), o.f32.data(), T);
  // The routing decision too, so a reference can tell routing errors from arithmetic.
  std::vector<float> logits(T * E);
  cpu::MatMul(logits.data(), x.f32.data(), w.router, T);
  HostTensor ids;
  ids.shape = {T, c.moe.top_k};
  ids.i32.assign(T * c.moe.top_k, 0);
  HostTensor wts = F32({T, c.moe.top_k});
  cpu::MoeRoute(ids.i32.data(), wts.f32.data(), logits.data(), w.bias, T,
                {E, c.moe.top_k, 1, 1, c.moe.renormalize, c.moe.routed_scaling});
  out["out"] = std::move(o);
  out["ids"] = std::move(ids);
  out["weights"] = std::move(wts);
  return absl::OkStatus();
}

const std::map<std::string, OpFn>& Ops() {
  static const std::map<std::string, OpFn> kOps = {
      {"attn_res", AttnRes}, {"kda", Kda},           {"kda_gate", KdaGate}, {"latent_moe", LatentMoe},
      {"mla", Mla},          {"moe_route", MoeRoute}, {"mxfp4_matmul", Mxfp4MatMul},
      {"rmsnorm", RmsNorm},  {"situ", Situ}};
  return kOps;
}

}  // namespace
}  // namespace kimi::tools

int main(int argc, char** argv) {
  using namespace kimi::tools;
  std::vector<std::string> names;
  for (const auto& [name, fn] : Ops()) names.push_back(name);
  std::vector<char*> args = kimi::tools::ParseFlags(
      argc, argv,
      absl::StrCat("Runs one CPU kernel on named tensors.\n  kimi-ops OP --in IN.safetensors --out "
                   "OUT.safetensors [--mode M]\nOPs: ",
                   absl::StrJoin(names, ", ")));
  if (args.size() != 2 || absl::GetFlag(FLAGS_in).empty() || absl::GetFlag(FLAGS_out).empty()) {
    std::fprintf(stderr, "usage: kimi-ops OP --in IN.safetensors --out OUT.safetensors\n");
    return 2;
  }
  auto op = Ops().find(args[1]);
  if (op == Ops().end()) {
    std::fprintf(stderr, "kimi-ops: unknown op \"%s\"; known: %s\n", args[1],
                 absl::StrJoin(names, ", ").c_str());
    return 2;
  }
  auto in = ReadTensors(absl::GetFlag(FLAGS_in));
  if (!in.ok()) {
    std::fprintf(stderr, "kimi-ops: %s\n", std::string(in.status().message()).c_str());
    return 1;
  }
  TensorMap out;
  if (absl::Status s = op->second(*in, out); !s.ok()) {
    std::fprintf(stderr, "kimi-ops %s: %s\n", args[1], std::string(s.message()).c_str());
    return 1;
  }
  if (absl::Status s = WriteTensors(absl::GetFlag(FLAGS_out), out); !s.ok()) {
    std::fprintf(stderr, "kimi-ops: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
