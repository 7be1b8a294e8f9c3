"""Reference ops in float64, written from /work/shared/KIMI_LINEAR.md and KIMI_K3.md.

Every function converts its inputs to float64 and computes in float64. Shapes follow the kimi-ops contract
(DESIGN.md op table). Section numbers in comments refer to the fact files ("KL" = KIMI_LINEAR.md, "K3" =
KIMI_K3.md).
"""
import math

import torch

F64 = torch.float64


def _f(x):
    return x.to(F64) if torch.is_tensor(x) else torch.tensor(x, dtype=F64)


# ---------------------------------------------------------------------------------------------------------------
# Elementwise / norms
# ---------------------------------------------------------------------------------------------------------------

def sigmoid(x):
    return torch.sigmoid(_f(x))


def silu(x):
    x = _f(x)
    return x * torch.sigmoid(x)


def softplus_thresh(z, threshold=20.0):
    """softplus(z) = log(1 + exp(z)), and z itself for z > threshold (KL 3.1 step 2: threshold 20)."""
    z = _f(z)
    return torch.where(z > threshold, z, torch.log1p(torch.exp(torch.clamp(z, max=threshold))))


def rmsnorm(x, weight=None, eps=1e-5):
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight (no 1+weight offset; KL 3.0)."""
    x = _f(x)
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * _f(weight)
    return y


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2, -1) + eps): eps added to the SUM of squares inside the root (KL 3.1 step 5)."""
    x = _f(x)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def silu_glu(gate, up):
    """SiLU(gate) * up (KL 3.3)."""
    return silu(gate) * _f(up)


def situ_glu(gate, up, beta=4.0, linear_beta=25.0):
    """SiTU-GLU (K3 5.2): beta*tanh(gate/beta)*sigmoid(gate) * linear_beta*tanh(up/linear_beta)."""
    gate, up = _f(gate), _f(up)
    a = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    u = linear_beta * torch.tanh(up / linear_beta)
    return a * u


# ---------------------------------------------------------------------------------------------------------------
# KDA
# ---------------------------------------------------------------------------------------------------------------

def kda_gate(g_raw, A_log, dt_bias, lower_bound=None):
    """Per-channel log decay g [T,H,K] from g_raw [T,H,K].

    lower_bound None (Kimi Linear, KL 3.1 step 2): g = -exp(A_log[h]) * softplus(g_raw + dt_bias), threshold 20.
    lower_bound given (K3 5.3):                    g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias)).
    A_log may be longer than H (K3 stores it zero-padded to head_dim): the first H entries are used.
    """
    g_raw = _f(g_raw)
    T, H, K = g_raw.shape
    a = _f(A_log).reshape(-1)[:H].reshape(1, H, 1)
    z = g_raw + _f(dt_bias).reshape(-1)[:H * K].reshape(1, H, K)
    if lower_bound is None:
        return -torch.exp(a) * softplus_thresh(z, 20.0)
    return float(lower_bound) * torch.sigmoid(torch.exp(a) * z)


def kda_recurrent(q, k, v, g, beta, scale=None, initial_state=None):
    """Token-by-token KDA (KL 3.1 step 6; identical in K3 5.3). q,k [B,T,H,K], v [B,T,H,V], g [B,T,H,K] (log decay),
    beta [B,T,H], initial_state [B,H,K,V]. q and k are used as given (no L2 norm here).

    Per head, state S [K,V]:
        S = S * exp(g_t)[:, None]        decay BEFORE the delta-rule read
        u = beta_t * (v_t - S^T k_t)
        S = S + k_t (outer) u
        o_t = S^T (scale * q_t)          output from the UPDATED state
    Returns o [B,T,H,V], final_state [B,H,K,V].
    """
    q, k, v, g, beta = map(_f, (q, k, v, g, beta))
    B, T, H, K = q.shape
    V = v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    S = torch.zeros(B, H, K, V, dtype=F64)
    if initial_state is not None:
        S = S + _f(initial_state)
    o = torch.zeros(B, T, H, V, dtype=F64)
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)                       # [B,H,K,V]
        kt = k[:, t]                                                   # [B,H,K]
        read = torch.einsum("bhkv,bhk->bhv", S, kt)                   # S^T k
        u = beta[:, t].unsqueeze(-1) * (v[:, t] - read)                # [B,H,V]
        S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale)
    return o, S


def causal_conv_silu(x, w, state=None):
    """Causal depthwise conv over time + SiLU (KL 3.1 step 1).

    x [T,C], w [C,W] (or [C,1,W]), state [W-1,C] = the previous W-1 inputs (oldest first) or None (zeros).
    y[t,c] = silu( sum_j w[c,j] * x[t-(W-1)+j, c] ): tap W-1 multiplies the current token.
    Returns y [T,C] and the new state (last W-1 inputs).
    """
    x = _f(x)
    w = _f(w).reshape(x.shape[1], -1)
    W = w.shape[1]
    if state is None:
        state = torch.zeros(W - 1, x.shape[1], dtype=F64)
    xp = torch.cat([_f(state), x], 0)                                  # [W-1+T, C]
    T = x.shape[0]
    y = torch.zeros_like(x)
    for j in range(W):
        y = y + w[:, j].unsqueeze(0) * xp[j:j + T]
    return silu(y), xp[T:].clone()


# ---------------------------------------------------------------------------------------------------------------
# MLA (plain, non-absorbed form; KL 3.2, K3 5.4)
# ---------------------------------------------------------------------------------------------------------------

def mla_attention(q, kv_latent, k_pe, w_kv_b, scale=None):
    """q [T,Hh,Dn+Dr], kv_latent [S,R] (already RMS-normalised), k_pe [S,Dr], w_kv_b [Hh*(Dn+Dv), R].
    Per head the rows of w_kv_b are [k_nope (Dn) | v (Dv)]. k_h = [k_nope_h | k_pe] (k_pe shared by all heads,
    no rotary). The T queries are the last T of the S positions; causal softmax. Returns [T,Hh,Dv]."""
    q, c, kpe, wkvb = map(_f, (q, kv_latent, k_pe, w_kv_b))
    T, Hh, Dqk = q.shape
    S, R = c.shape
    Dr = kpe.shape[1]
    Dn = Dqk - Dr
    per_head = wkvb.shape[0] // Hh
    Dv = per_head - Dn
    if scale is None:
        scale = Dqk ** -0.5
    kv = (c @ wkvb.T).view(S, Hh, Dn + Dv)
    k_nope, vv = kv[..., :Dn], kv[..., Dn:]
    k = torch.cat([k_nope, kpe.unsqueeze(1).expand(S, Hh, Dr)], -1)    # [S,Hh,Dqk]
    scores = torch.einsum("thd,shd->hts", q, k) * scale                  # [Hh,T,S]
    qpos = torch.arange(S - T, S).unsqueeze(1)
    kpos = torch.arange(S).unsqueeze(0)
    scores = scores.masked_fill((kpos > qpos).unsqueeze(0), float("-inf"))
    p = torch.softmax(scores, -1)
    return torch.einsum("hts,shd->thd", p, vv)


# ---------------------------------------------------------------------------------------------------------------
# MoE routing (KL 3.4, K3 5.5; grouped top-k as DeepSeek-V3 noaux_tc)
# ---------------------------------------------------------------------------------------------------------------

def _order_desc(x):
    """Indices sorting the last dim by descending value, ties to the lower index."""
    # stable sort of -x keeps equal keys in index order
    return torch.sort(-x, dim=-1, stable=True).indices


def moe_route(logits, bias, top_k, scaling=1.0, renormalize=True, num_groups=1, topk_groups=1):
    """Returns ids [T,k] (int64, best biased score first, ties to the lower id) and weights [T,k] (float64):
    s = sigmoid(logits); selection on s + bias (groups: group score = sum of its two largest biased scores,
    keep the best topk_groups groups); weights = s[ids], / (sum + 1e-20) if renormalize, * scaling."""
    s = torch.sigmoid(_f(logits))
    T, E = s.shape
    sc = s + _f(bias).reshape(1, E)
    if num_groups > 1:
        G = num_groups
        grp = sc.view(T, G, E // G)
        m = min(2, E // G)
        gscore = torch.sort(grp, dim=-1, descending=True).values[..., :m].sum(-1)   # [T,G]
        keep = _order_desc(gscore)[:, :topk_groups]
        gmask = torch.zeros(T, G, dtype=torch.bool)
        gmask.scatter_(1, keep, True)
        emask = gmask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        sc = sc.masked_fill(~emask, float("-inf"))
    ids = _order_desc(sc)[:, :top_k]
    w = torch.gather(s, 1, ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * scaling


# ---------------------------------------------------------------------------------------------------------------
# Block AttnRes primitive (K3 5.1)
# ---------------------------------------------------------------------------------------------------------------

def attn_res(bank, partial, norm_weight, proj_weight, eps=1e-5):
    """bank [T,NB,H] (closed block rows), partial [T,H]. Rows V = [bank..., partial]; score_j =
    (rmsnorm_noweight(V_j) . (norm_weight * proj_weight)); softmax over rows; out = sum_j p_j V_j (raw rows).
    Returns out [T,H], probs [T,NB+1]."""
    bank, partial = _f(bank), _f(partial)
    V = torch.cat([bank, partial.unsqueeze(1)], 1)                       # [T,NB+1,H]
    cw = _f(norm_weight).reshape(-1) * _f(proj_weight).reshape(-1)
    scores = (V * cw).sum(-1) * torch.rsqrt((V * V).mean(-1) + eps)     # [T,NB+1]
    p = torch.softmax(scores, -1)
    return (p.unsqueeze(-1) * V).sum(1), p


# ---------------------------------------------------------------------------------------------------------------
# MXFP4 (OCP MX: E2M1 elements, one E8M0 scale per 32 consecutive inputs; K3 section 4)
# ---------------------------------------------------------------------------------------------------------------

# E2M1 magnitudes by the low 3 bits (exponent bits 2..1, mantissa bit 0): 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6.
E2M1_MAG = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_decode(codes):
    """codes: integer tensor of 4-bit values. Bit 3 = sign."""
    codes = codes.to(torch.int64)
    mag = torch.tensor(E2M1_MAG, dtype=F64)[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def e8m0_decode(s):
    """E8M0 scale byte -> 2^(s-127); 255 is NaN in the OCP spec."""
    s = s.to(torch.int64)
    v = torch.pow(torch.tensor(2.0, dtype=F64), (s - 127).to(F64))
    return torch.where(s == 255, torch.tensor(float("nan"), dtype=F64), v)


def mxfp4_dequant(packed, scale):
    """packed [N, K/2] uint8 (low nibble = even column, high nibble = odd column), scale [N, K/32] uint8 E8M0.
    Returns W [N, K] float64."""
    p = packed.to(torch.int64)
    N, half = p.shape
    K = half * 2
    w = torch.empty(N, K, dtype=F64)
    w[:, 0::2] = e2m1_decode(p & 0xF)
    w[:, 1::2] = e2m1_decode(p >> 4)
    sc = e8m0_decode(scale).reshape(N, -1)
    if sc.shape[1] * 32 != K:
        raise ValueError(f"mxfp4: scale shape {tuple(scale.shape)} does not match {K} columns / 32")
    return w * sc.repeat_interleave(32, dim=1)


def mxfp4_matmul(x, packed, scale):
    return _f(x) @ mxfp4_dequant(packed, scale).T


def _selfcheck_mxfp4():
    """Hand-made bytes: byte 0x21 -> cols (1: 0.5, 2: 1.0); 0xF8 -> (-0, -6); 0x7A -> (-1, 6); scale 128 -> x2."""
    packed = torch.tensor([[0x21, 0xF8, 0x7A] + [0] * 13], dtype=torch.uint8)
    w = mxfp4_dequant(packed, torch.tensor([[127]], dtype=torch.uint8))
    assert w[0, :6].tolist() == [0.5, 1.0, -0.0, -6.0, -1.0, 6.0], w[0, :6]
    assert math.copysign(1.0, w[0, 2].item()) == -1.0
    w2 = mxfp4_dequant(packed, torch.tensor([[128]], dtype=torch.uint8))
    assert w2[0, :6].tolist() == [1.0, 2.0, -0.0, -12.0, -2.0, 12.0]
    w3 = mxfp4_dequant(packed, torch.tensor([[125]], dtype=torch.uint8))
    assert w3[0, :6].tolist() == [0.125, 0.25, -0.0, -1.5, -0.25, 1.5]
    # every code once: 0..15
    allc = torch.tensor([[(2 * i + 1) << 4 | (2 * i) for i in range(8)] + [0] * 8], dtype=torch.uint8)
    w4 = mxfp4_dequant(allc, torch.tensor([[127]], dtype=torch.uint8))[0, :16].tolist()
    assert w4 == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], w4
    return True
