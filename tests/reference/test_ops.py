"""Checks every `kimi-ops` op against the float64 reference in kimi_ref/ops.py.

Usage: /usr/bin/python3 tests/reference/test_ops.py --kimi-ops build/bin/kimi-ops [--filter REGEX] [--seed N]

One line per case: PASS/FAIL, op, case name, max abs error, max error relative to the output scale, tolerance.
Exit status 1 if any case fails.

Inputs are generated in float64, rounded to the dtype written to the input file (fp32 unless stated), and the
reference runs on exactly those rounded values, so a difference is the op's own error. Error measure per output
tensor: err = max |got - ref|, scale = max(max |ref|, floor); a case passes if err <= tol * scale for every output
(the tolerance is relative to the output's magnitude; the floor avoids dividing by a near-zero output).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_ref import ops, st  # noqa: E402

F64 = torch.float64
F32 = torch.float32
U32 = 2.0 ** -24   # fp32 unit roundoff (half an ulp at 1.0)

# ---------------------------------------------------------------------------------------------------------------
# Tolerances (relative to the output scale max|ref|; see module docstring). Each is a bound for fp32
# arithmetic with a margin of about 10x over the error model stated beside it; the observed errors are printed.
# ---------------------------------------------------------------------------------------------------------------
# Elementwise chains of a few fp32 transcendental ops (exp, log1p, sigmoid, tanh: each within ~2 ulp) and
# multiplications: < ~10 ulp = 6e-7 relative to the element; against the tensor scale this is smaller still.
TOL_ELEMENTWISE = 1e-5
# rmsnorm: a sum of H squares (H <= 4096) in fp32: relative error of the mean <= H*u in the worst case, sqrt(H)*u
# typically (~4e-6 worst for H=4096 with naive summation); the rsqrt and the products add a few ulp.
TOL_RMSNORM = 2e-5
# situ: like elementwise, but the product of two branches each bounded by 4 and 25 (|out| <= 100); element-wise
# errors are a few ulp of each branch.
TOL_SITU = 1e-5
# attn_res: per row a length-H RMS and a length-H dot product (errors ~H*u relative each, H <= 512 -> 3e-5
# worst case, ~1e-6 typical), then a softmax over <= 9 rows (exp error scales with |score| * u) and a weighted
# sum of <= 9 rows.
TOL_ATTN_RES = 5e-5
# mxfp4_matmul: dequantised weights are exact in fp32 (E2M1 x 2^k); each output is a dot product of K <= 256
# terms: fp32 accumulation error <= K*u*sum|x_i w_i| (~1.5e-5 worst, relative to the sum of magnitudes).
TOL_MXFP4 = 5e-5
# mla: scores are dot products of Dqk <= 192 terms after a latent decompression of R <= 128 terms; softmax over
# S <= 70 keys; output a weighted sum of S values of Dv terms: ~ (R + Dqk + S)*u ~ 2.4e-5 worst case relative.
TOL_MLA = 1e-4
# kda: o and the state are built by T <= 130 recurrent steps, each with length-K dot products (K <= 128). The step
# map S -> (I - beta k k^T) diag(exp g) S is non-expansive (|k| = 1, 0 < beta < 1, g <= 0), so rounding errors
# of the steps add up at most linearly: <= T * c * K * u * max|S| ~ 130 * 2 * 128 * 6e-8 = 2e-3 in the worst
# case, ~sqrt(T*K)*u ~ 1e-5 typical. The chunked (WY/UT) form adds a 64x64 unit-lower-triangular solve whose
# entries are bounded by 1 in magnitude. 3e-4 covers realistic inputs with margin while still catching any
# wrong-formula bug (those give O(1e-2..1) errors).
TOL_KDA = 3e-4
# moe_route weights: one sigmoid (~2 ulp), a sum of k <= 16 terms and a division: <= (k+4)*u ~ 1.2e-6.
TOL_ROUTE_W = 1e-5
# moe_route ids: exact, except between experts whose biased scores differ by less than fp32 can resolve; such a
# swap is accepted when the biased scores position by position agree within this bound (a few ulp of O(1) scores).
TOL_ROUTE_TIE = 1e-6


class Runner:
    def __init__(self, exe, tmp):
        self.exe = exe
        self.tmp = tmp
        self.n = 0

    def __call__(self, op, inputs, mode=None):
        self.n += 1
        fin = os.path.join(self.tmp, f"in{self.n}.safetensors")
        fout = os.path.join(self.tmp, f"out{self.n}.safetensors")
        st.save_file(inputs, fin)
        cmd = [self.exe, op, "--in", fin, "--out", fout]
        if mode:
            cmd += ["--mode", mode]
        for attempt in range(3):
            if os.path.exists(self.exe):
                break
            import time
            time.sleep(5)   # the binary may be being rebuilt by another developer
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        raw = st.SafeFile(fout)
        out = {k: raw.get(k) for k in raw.keys()}
        os.remove(fin)
        os.remove(fout)
        return out


def f32(x):
    """Round a float64 tensor to fp32 (what goes in the file) and return (fp32 tensor, float64 of it)."""
    t = x.to(F32).contiguous()
    return t, t.to(F64)


def compare(name, got, ref, tol, floor=1e-3):
    got = got.to(F64)
    if tuple(got.shape) != tuple(ref.shape):
        return False, f"{name}: shape {tuple(got.shape)} != ref {tuple(ref.shape)}", float("inf"), float("inf")
    if not torch.isfinite(got).all():
        return False, f"{name}: non-finite output", float("inf"), float("inf")
    err = (got - ref).abs().max().item() if got.numel() else 0.0
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, floor)
    ok = err <= tol * scale
    return ok, f"{name}: abs {err:.2e} rel {err / scale:.2e}", err, err / scale


class Results:
    def __init__(self, filt):
        self.fail = 0
        self.count = 0
        self.filt = re.compile(filt) if filt else None
        self.worst = {}

    def want(self, label):
        return self.filt is None or self.filt.search(label)

    def report(self, op, label, checks, tol):
        ok = all(c[0] for c in checks)
        self.count += 1
        if not ok:
            self.fail += 1
        rel = max((c[3] for c in checks), default=0.0)
        self.worst[op] = max(self.worst.get(op, 0.0), rel)
        print(f"{'PASS' if ok else 'FAIL'} {op:13s} {label:58s} {'; '.join(c[1] for c in checks)}  (tol {tol:.0e})",
              flush=True)

    def error(self, op, label, e):
        self.count += 1
        self.fail += 1
        print(f"FAIL {op:13s} {label:58s} error: {e}", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------

def make_gate(regime, T, B, H, K, gen):
    """Realistic log decays [B,T,H,K] produced by the reference kda_gate (float64)."""
    a_log = torch.log(torch.empty(H, dtype=F64).uniform_(1.0, 16.0, generator=gen))   # fla init: A ~ U(1,16)
    dt = torch.randn(H * K, generator=gen, dtype=F64) * 0.5
    if regime == "kl":            # Kimi Linear form, typical: softplus of ~N(-4,1) -> g ~ -0.02 .. -1
        raw = torch.randn(B * T, H, K, generator=gen, dtype=F64) - 4.0
        g = ops.kda_gate(raw, a_log, dt, None)
    elif regime == "kl_strong":   # Kimi Linear form, strong decay: g down to ~ -100 per token
        raw = torch.randn(B * T, H, K, generator=gen, dtype=F64) * 2.0 + 2.0
        g = ops.kda_gate(raw, a_log, dt, None)
    elif regime == "k3":          # K3 bounded form, mixed: g in (-5, 0)
        raw = torch.randn(B * T, H, K, generator=gen, dtype=F64) * 1.5 - 1.0
        g = ops.kda_gate(raw, a_log, dt, -5.0)
    elif regime == "k3_strong":   # K3 bounded form saturated at the bound: g ~ -5 every token (cumsum -320/chunk)
        raw = torch.randn(B * T, H, K, generator=gen, dtype=F64) + 3.0
        g = ops.kda_gate(raw, a_log, dt, -5.0)
    else:
        raise ValueError(regime)
    return g.view(B, T, H, K)


def kda_cases(R, run, gen):
    H = 2
    for (K, V, Ts, regimes) in [(32, 48, (1, 5, 64, 100, 130), ("kl", "kl_strong", "k3", "k3_strong")),
                                (128, 128, (130,), ("kl", "k3_strong"))]:
        for T in Ts:
            for regime in regimes:
                for with_init in (False, True):
                    label_base = f"B2 T{T} H{H} K{K} V{V} g={regime} init={int(with_init)}"
                    if not any(R.want(f"kda {label_base} {m}") for m in ("chunk", "recurrent")):
                        continue
                    B = 2
                    q = ops.l2norm(torch.randn(B, T, H, K, generator=gen, dtype=F64))
                    k = ops.l2norm(torch.randn(B, T, H, K, generator=gen, dtype=F64))
                    v = ops.silu(torch.randn(B, T, H, V, generator=gen, dtype=F64) * 1.5)
                    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen, dtype=F64) * 2.0)
                    g = make_gate(regime, T, B, H, K, gen)
                    ins = {}
                    vals = {}
                    for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
                        ins[n], vals[n] = f32(x)
                    init = None
                    if with_init:
                        ins["initial_state"], init = f32(torch.randn(B, H, K, V, generator=gen, dtype=F64) * 0.5)
                    ro, rs = ops.kda_recurrent(vals["q"], vals["k"], vals["v"], vals["g"], vals["beta"],
                                               None, init)
                    for mode in ("chunk", "recurrent"):
                        label = f"{label_base} {mode}"
                        if not R.want(f"kda {label}"):
                            continue
                        try:
                            out = run("kda", ins, mode)
                            R.report("kda", label, [compare("o", out["o"], ro, TOL_KDA),
                                                    compare("state", out["final_state"], rs, TOL_KDA)], TOL_KDA)
                        except Exception as e:  # noqa: BLE001
                            R.error("kda", label, e)
    # explicit scale
    B, T, K, V = 1, 70, 16, 24
    label = f"B1 T{T} H{H} K{K} V{V} g=k3 scale=0.3"
    if R.want(f"kda {label}"):
        ins, vals = {}, {}
        for n, x in (("q", ops.l2norm(torch.randn(B, T, H, K, generator=gen, dtype=F64))),
                     ("k", ops.l2norm(torch.randn(B, T, H, K, generator=gen, dtype=F64))),
                     ("v", torch.randn(B, T, H, V, generator=gen, dtype=F64)),
                     ("g", make_gate("k3", T, B, H, K, gen)),
                     ("beta", torch.sigmoid(torch.randn(B, T, H, generator=gen, dtype=F64)))):
            ins[n], vals[n] = f32(x)
        ins["scale"] = torch.tensor([0.3], dtype=F32)
        ro, rs = ops.kda_recurrent(vals["q"], vals["k"], vals["v"], vals["g"], vals["beta"], float(F32_(0.3)))
        for mode in ("chunk", "recurrent"):
            try:
                out = run("kda", ins, mode)
                R.report("kda", f"{label} {mode}", [compare("o", out["o"], ro, TOL_KDA),
                                                    compare("state", out["final_state"], rs, TOL_KDA)], TOL_KDA)
            except Exception as e:  # noqa: BLE001
                R.error("kda", f"{label} {mode}", e)


def F32_(x):
    return torch.tensor(x, dtype=F32).to(F64).item()


def kda_gate_cases(R, run, gen):
    for (T, H, K) in [(1, 2, 16), (7, 4, 16), (33, 3, 128)]:
        for form in ("softplus", "bounded"):
            for pad in (False, True):
                label = f"T{T} H{H} K{K} {form} A_log{'[K] padded' if pad else '[H]'}"
                if not R.want(f"kda_gate {label}"):
                    continue
                g_raw = torch.randn(T, H, K, generator=gen, dtype=F64) * 4.0
                g_raw.view(-1)[::7] += 25.0        # exercise the softplus threshold (z > 20)
                a = torch.log(torch.empty(H, dtype=F64).uniform_(1.0, 16.0, generator=gen))
                if pad:
                    a = torch.cat([a, torch.zeros(K - H, dtype=F64)]) if K > H else a
                dt = torch.randn(H * K, generator=gen, dtype=F64)
                ins, vals = {}, {}
                for n, x in (("g_raw", g_raw), ("A_log", a), ("dt_bias", dt)):
                    ins[n], vals[n] = f32(x)
                lb = None
                if form == "bounded":
                    ins["lower_bound"] = torch.tensor([-5.0], dtype=F32)
                    lb = -5.0
                ref = ops.kda_gate(vals["g_raw"], vals["A_log"], vals["dt_bias"], lb)
                try:
                    out = run("kda_gate", ins)
                    R.report("kda_gate", label, [compare("g", out["g"], ref, TOL_ELEMENTWISE)], TOL_ELEMENTWISE)
                except Exception as e:  # noqa: BLE001
                    R.error("kda_gate", label, e)


def rmsnorm_cases(R, run, gen):
    for (N, H, eps, dt) in [(1, 16, None, F32), (7, 64, None, F32), (5, 128, 1e-6, F32), (33, 1000, None, F32),
                            (3, 4096, 1e-5, F32), (4, 64, None, torch.bfloat16), (4, 64, None, torch.float16),
                            (4, 64, 1e-6, F64)]:
        label = f"N{N} H{H} eps={eps} in={str(dt).replace('torch.', '')}"
        if not R.want(f"rmsnorm {label}"):
            continue
        x = torch.randn(N, H, generator=gen, dtype=F64) * 3.0
        x[0] *= 1e-3                                   # a row with small RMS (eps matters)
        w = 1.0 + 0.2 * torch.randn(H, generator=gen, dtype=F64)
        xin = x.to(dt)
        ins = {"x": xin, "weight": w.to(F32)}
        if eps is not None:
            ins["eps"] = torch.tensor([eps], dtype=F32 if dt != F64 else F64)
        ref = ops.rmsnorm(xin.to(F64), w.to(F32).to(F64), F32_(eps if eps is not None else 1e-5)
                          if dt != F64 else (eps if eps is not None else 1e-5))
        try:
            out = run("rmsnorm", ins)
            R.report("rmsnorm", label, [compare("out", out["out"], ref, TOL_RMSNORM)], TOL_RMSNORM)
        except Exception as e:  # noqa: BLE001
            R.error("rmsnorm", label, e)


def situ_cases(R, run, gen):
    for (N, Fd, betas) in [(1, 8, None), (9, 64, None), (17, 300, (2.0, 10.0)), (4, 4096, None)]:
        label = f"N{N} F{Fd} betas={betas}"
        if not R.want(f"situ {label}"):
            continue
        gate = torch.randn(N, Fd, generator=gen, dtype=F64) * 6.0
        up = torch.randn(N, Fd, generator=gen, dtype=F64) * 30.0     # reaches the linear_beta softcap
        gate.view(-1)[::11] = 60.0
        gate.view(-1)[5::11] = -60.0
        ins, vals = {}, {}
        for n, x in (("gate", gate), ("up", up)):
            ins[n], vals[n] = f32(x)
        b, lb = 4.0, 25.0
        if betas:
            b, lb = betas
            ins["beta"] = torch.tensor([b], dtype=F32)
            ins["linear_beta"] = torch.tensor([lb], dtype=F32)
        ref = ops.situ_glu(vals["gate"], vals["up"], b, lb)
        try:
            out = run("situ", ins)
            R.report("situ", label, [compare("out", out["out"], ref, TOL_SITU)], TOL_SITU)
        except Exception as e:  # noqa: BLE001
            R.error("situ", label, e)


def attn_res_cases(R, run, gen):
    for (T, NB, H, sharp, eps) in [(1, 1, 64, 1.0, None), (5, 3, 64, 1.0, None), (17, 8, 512, 1.0, None),
                                   (6, 4, 256, 6.0, 1e-6), (3, 2, 512, 1.0, None)]:
        label = f"T{T} NB{NB} H{H} sharp={sharp} eps={eps}"
        if not R.want(f"attn_res {label}"):
            continue
        # bank rows of different magnitudes (embedding small, block sums grow with depth), partial sum O(1)
        scales = torch.tensor([0.05] + [0.5 * (j + 1) for j in range(NB - 1)], dtype=F64)
        bank = torch.randn(T, NB, H, generator=gen, dtype=F64) * scales.view(1, NB, 1)
        partial = torch.randn(T, H, generator=gen, dtype=F64) * 2.0
        if T >= 3:
            partial[2] *= 1e-4                      # a near-zero row (eps matters)
        nw = 1.0 + 0.1 * torch.randn(H, generator=gen, dtype=F64)
        pw = torch.randn(1, H, generator=gen, dtype=F64) * sharp / H ** 0.5 * 3.0
        ins, vals = {}, {}
        for n, x in (("bank", bank), ("partial", partial), ("norm_weight", nw), ("proj_weight", pw)):
            ins[n], vals[n] = f32(x)
        e = 1e-5
        if eps is not None:
            ins["eps"] = torch.tensor([eps], dtype=F32)
            e = F32_(eps)
        ro, rp = ops.attn_res(vals["bank"], vals["partial"], vals["norm_weight"], vals["proj_weight"], e)
        try:
            out = run("attn_res", ins)
            R.report("attn_res", label, [compare("out", out["out"], ro, TOL_ATTN_RES),
                                         compare("probs", out["probs"], rp, TOL_ATTN_RES, floor=1.0)],
                     TOL_ATTN_RES)
        except Exception as e:  # noqa: BLE001
            R.error("attn_res", label, e)


def check_route(out, logits, bias, top_k, scaling, renorm, ng, tg):
    """Compares kimi-ops moe_route outputs with the reference; near-ties may swap (see TOL_ROUTE_TIE)."""
    rid, rw = ops.moe_route(logits, bias, top_k, scaling, renorm, ng, tg)
    gid = out["ids"].to(torch.int64)
    gw = out["weights"].to(F64)
    if tuple(gid.shape) != tuple(rid.shape):
        return [(False, f"ids shape {tuple(gid.shape)} != {tuple(rid.shape)}", 0, float("inf"))]
    if out["ids"].dtype != torch.int32:
        return [(False, f"ids dtype {out['ids'].dtype} != int32", 0, float("inf"))]
    s = torch.sigmoid(logits)
    sc = s + bias.view(1, -1)
    mism = (gid != rid).any(1)
    msg = f"ids: {int(mism.sum())} rows differ"
    ok_ids = True
    if mism.any():
        if (gid < 0).any() or (gid >= logits.shape[1]).any():
            return [(False, "ids out of range", 0, float("inf"))]
        dup = torch.tensor([len(set(r.tolist())) != top_k for r in gid]).any()
        gap = (torch.gather(sc, 1, gid) - torch.gather(sc, 1, rid)).abs().max().item()
        ok_ids = (not dup) and gap <= TOL_ROUTE_TIE
        msg += f" (near-tie swaps, max biased-score gap {gap:.1e})"
        # reference weights for the ids the op chose (same formula)
        w = torch.gather(s, 1, gid)
        if renorm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        rw = w * scaling
    c = compare("weights", gw, rw, TOL_ROUTE_W)
    return [(ok_ids, msg, 0, 0.0), c]


def moe_route_cases(R, run, gen):
    cfgs = [  # T, E, k, scaling, renorm, groups, topk_groups, kind
        (1, 8, 2, 2.446, 1, 1, 1, "random"), (9, 8, 2, 2.446, 1, None, None, "random"),
        (33, 64, 8, 1.0, 1, None, None, "random"), (5, 256, 8, 2.446, 0, None, None, "random"),
        (17, 896, 16, 1.0, 1, None, None, "random"), (11, 64, 8, 2.5, 1, 8, 4, "random"),
        (7, 256, 8, 2.5, 1, 8, 4, "random"), (6, 32, 4, 1.0, 1, 4, 2, "random"),
        (8, 16, 4, 1.0, 1, None, None, "ties"), (8, 64, 6, 1.0, 1, 8, 3, "ties"),
    ]
    for (T, E, k, scaling, renorm, ng, tg, kind) in cfgs:
        label = f"T{T} E{E} k{k} scale={scaling} renorm={renorm} groups={ng}/{tg} {kind}"
        if not R.want(f"moe_route {label}"):
            continue
        if kind == "ties":
            logits = torch.randint(-3, 4, (T, E), generator=gen).to(F64) * 0.5   # many exact ties
            bias = torch.zeros(E, dtype=F64)
        else:
            logits = torch.randn(T, E, generator=gen, dtype=F64) * 2.0
            bias = torch.randn(E, generator=gen, dtype=F64) * 0.05
        ins, vals = {}, {}
        for n, x in (("logits", logits), ("bias", bias)):
            ins[n], vals[n] = f32(x)
        ins["top_k"] = torch.tensor([k], dtype=torch.int32)
        ins["scaling"] = torch.tensor([scaling], dtype=F32)
        ins["renormalize"] = torch.tensor([renorm], dtype=torch.int32)
        if ng is not None:
            ins["num_groups"] = torch.tensor([ng], dtype=torch.int32)
            ins["topk_groups"] = torch.tensor([tg], dtype=torch.int32)
        try:
            out = run("moe_route", ins)
            R.report("moe_route", label, check_route(out, vals["logits"], vals["bias"], k, F32_(scaling),
                                                     bool(renorm), ng or 1, tg or 1), TOL_ROUTE_W)
        except Exception as e:  # noqa: BLE001
            R.error("moe_route", label, e)


def mxfp4_cases(R, run, gen):
    # every E2M1 code and a few scales, with x = identity: out = dequantised W^T exactly
    label = "hand-made bytes, identity x (exact)"
    if R.want(f"mxfp4_matmul {label}"):
        K = 64
        codes = list(range(16)) * (K // 16)
        rows = []
        for r in range(4):
            c = codes[r:] + codes[:r]
            rows.append([c[2 * j] | (c[2 * j + 1] << 4) for j in range(K // 2)])
        packed = torch.tensor(rows, dtype=torch.uint8)
        scale = torch.tensor([[127, 128], [120, 130], [126, 127], [100, 150]], dtype=torch.uint8)
        x = torch.eye(K, dtype=F64)
        ref = ops.mxfp4_matmul(x, packed, scale)
        # hand check of the table itself: row 0, first 16 columns = codes 0..15 at scale 2^0
        assert ref[:16, 0].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
        try:
            out = run("mxfp4_matmul", {"x": x.to(F32), "weight_packed": packed, "weight_scale": scale})
            R.report("mxfp4_matmul", label, [compare("out", out["out"], ref, 0.0)], 0.0)
        except Exception as e:  # noqa: BLE001
            R.error("mxfp4_matmul", label, e)
    for (T, K, N) in [(1, 32, 1), (5, 64, 16), (3, 256, 48), (16, 3584 // 14, 40), (2, 512, 8)]:
        label = f"T{T} K{K} N{N} random bytes"
        if not R.want(f"mxfp4_matmul {label}"):
            continue
        packed = torch.randint(0, 256, (N, K // 2), generator=gen).to(torch.uint8)
        scale = torch.randint(118, 132, (N, K // 32), generator=gen).to(torch.uint8)
        xin, x = f32(torch.randn(T, K, generator=gen, dtype=F64))
        ref = ops.mxfp4_matmul(x, packed, scale)
        try:
            out = run("mxfp4_matmul", {"x": xin, "weight_packed": packed, "weight_scale": scale})
            R.report("mxfp4_matmul", label, [compare("out", out["out"], ref, TOL_MXFP4)], TOL_MXFP4)
        except Exception as e:  # noqa: BLE001
            R.error("mxfp4_matmul", label, e)


def mla_cases(R, run, gen):
    for (T, S, Hh, Dn, Dr, Dv, Rk, scale, sharp) in [
            (1, 1, 1, 16, 8, 16, 32, None, 1.0), (7, 7, 4, 16, 8, 12, 32, None, 1.0),
            (3, 10, 2, 16, 8, 24, 32, None, 1.0), (1, 65, 4, 16, 8, 16, 32, None, 1.0),
            (20, 40, 2, 128, 64, 128, 128, None, 1.0), (5, 5, 3, 16, 8, 16, 32, 0.5, 1.0),
            (9, 12, 2, 32, 16, 32, 64, None, 4.0)]:
        label = f"T{T} S{S} Hh{Hh} Dn{Dn} Dr{Dr} Dv{Dv} R{Rk} scale={scale} sharp={sharp}"
        if not R.want(f"mla {label}"):
            continue
        q = torch.randn(T, Hh, Dn + Dr, generator=gen, dtype=F64) * sharp
        lat = ops.rmsnorm(torch.randn(S, Rk, generator=gen, dtype=F64),
                          1.0 + 0.1 * torch.randn(Rk, generator=gen, dtype=F64))
        kpe = torch.randn(S, Dr, generator=gen, dtype=F64)
        wkvb = torch.randn(Hh * (Dn + Dv), Rk, generator=gen, dtype=F64) / Rk ** 0.5
        ins, vals = {}, {}
        for n, x in (("q", q), ("kv_latent", lat), ("k_pe", kpe), ("w_kv_b", wkvb)):
            ins[n], vals[n] = f32(x)
        sc = None
        if scale is not None:
            ins["scale"] = torch.tensor([scale], dtype=F32)
            sc = F32_(scale)
        ref = ops.mla_attention(vals["q"], vals["kv_latent"], vals["k_pe"], vals["w_kv_b"], sc)
        try:
            out = run("mla", ins)
            R.report("mla", label, [compare("out", out["out"], ref, TOL_MLA)], TOL_MLA)
        except Exception as e:  # noqa: BLE001
            R.error("mla", label, e)
    # Shapes without heads or without a latent are refused as shape errors (exit 1): no heads divided
    # by zero in the check (SIGFPE), no latent reached the kernel, which indexes a latent row.
    for (Hh, Rk) in [(0, 32), (2, 0)]:
        label = f"refuses Hh{Hh} R{Rk}"
        if not R.want(f"mla {label}"):
            continue
        ins = {"q": torch.zeros(3, Hh, 24, dtype=F32), "kv_latent": torch.zeros(4, Rk, dtype=F32),
               "k_pe": torch.zeros(4, 8, dtype=F32), "w_kv_b": torch.zeros(max(Hh, 1) * 32, Rk, dtype=F32)}
        try:
            run("mla", ins)
            R.error("mla", label, "accepted")
        except RuntimeError as e:
            ok = "failed (1)" in str(e) and "mla: q [T,Hh,Dn+Dr]" in str(e)
            R.report("mla", label, [(ok, "refused" if ok else f"not a shape error: {e}", 0.0, 0.0)], 0.0)


# latent_moe: routing (exact ids, see moe_route), then chains of fp32 matmuls: down-projection (H terms),
# expert gate/up (L terms) and down (I terms) with exactly dequantised MXFP4 weights, the SiTU product, a
# weighted sum of k experts, an RMSNorm over L, the up-projection (L terms) and a shared expert (H and S
# terms): ~(H + L + I + S) * u ~ 1e-5 worst case relative to the output scale; 1e-4 leaves margin.
TOL_LATENT_MOE = 1e-4


def latent_moe_reference(v, top_k, scaling, renorm, shared):
    """K3 Latent MoE (KIMI_K3.md 5.5) on float64 values: router on x, experts in the latent."""
    x = v["x"]
    ids, wts = ops.moe_route(x @ v["gate"].T, v["bias"], top_k, scaling, renorm)
    z = x @ v["down"].T
    y = torch.zeros(x.shape[0], z.shape[1], dtype=F64)
    E = v["gate"].shape[0]
    for e in range(E):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        w1 = ops.mxfp4_dequant(v["w1_packed"][e], v["w1_scale"][e])
        w3 = ops.mxfp4_dequant(v["w3_packed"][e], v["w3_scale"][e])
        w2 = ops.mxfp4_dequant(v["w2_packed"][e], v["w2_scale"][e])
        ze = z[rows]
        ye = ops.situ_glu(ze @ w1.T, ze @ w3.T) @ w2.T
        y.index_add_(0, rows, wts[rows, slot].unsqueeze(1) * ye)
    y = ops.rmsnorm(y, v["norm"], 1e-5)
    out = y @ v["up"].T
    if shared:
        out = out + ops.situ_glu(x @ v["shared_gate"].T, x @ v["shared_up"].T) @ v["shared_down"].T
    return ids, out


def latent_moe_cases(R, run, gen):
    for (T, H, L, I, E, k, scaling, renorm, shared) in [
            (1, 64, 32, 32, 8, 2, 1.0, True, True), (7, 64, 32, 64, 8, 2, 1.0, True, False),
            (16, 128, 64, 32, 16, 4, 2.5, False, True), (5, 256, 128, 96, 12, 3, 1.0, True, True)]:
        label = f"T{T} H{H} L{L} I{I} E{E} k{k} scaling={scaling} renorm={renorm} shared={shared}"
        if not R.want(f"latent_moe {label}"):
            continue
        raw = {"x": torch.randn(T, H, generator=gen, dtype=F64),
               "gate": torch.randn(E, H, generator=gen, dtype=F64) / H ** 0.5,
               "bias": 0.05 * torch.randn(E, generator=gen, dtype=F64),
               "down": torch.randn(L, H, generator=gen, dtype=F64) / H ** 0.5,
               "norm": 1.0 + 0.1 * torch.randn(L, generator=gen, dtype=F64),
               "up": torch.randn(H, L, generator=gen, dtype=F64) / L ** 0.5}
        if shared:
            raw["shared_gate"] = torch.randn(2 * I, H, generator=gen, dtype=F64) / H ** 0.5
            raw["shared_up"] = torch.randn(2 * I, H, generator=gen, dtype=F64) / H ** 0.5
            raw["shared_down"] = torch.randn(H, 2 * I, generator=gen, dtype=F64) / (2 * I) ** 0.5
        ins, vals = {}, {}
        for n, t in raw.items():
            ins[n], vals[n] = f32(t)
        for name, rows, cols in (("w1", I, L), ("w3", I, L), ("w2", L, I)):
            packed = torch.randint(0, 256, (E, rows, cols // 2), generator=gen).to(torch.uint8)
            # scales around 2^-4 keep expert outputs O(1) for O(1) inputs
            scale = torch.randint(121, 125, (E, rows, cols // 32), generator=gen).to(torch.uint8)
            ins[f"{name}_packed"], vals[f"{name}_packed"] = packed, packed
            ins[f"{name}_scale"], vals[f"{name}_scale"] = scale, scale
        ins["top_k"] = torch.tensor([k], dtype=torch.int32)
        ins["scaling"] = torch.tensor([scaling], dtype=F32)
        ins["renormalize"] = torch.tensor([1 if renorm else 0], dtype=torch.int32)
        ref_ids, ref = latent_moe_reference(vals, k, F32_(scaling), renorm, shared)
        try:
            out = run("latent_moe", ins)
            ids_ok = torch.equal(out["ids"].to(torch.int64), ref_ids.to(torch.int64))
            checks = [(ids_ok, "ids " + ("exact" if ids_ok else "DIFFER"), 0.0, 0.0),
                      compare("out", out["out"], ref, TOL_LATENT_MOE)]
            R.report("latent_moe", label, checks, TOL_LATENT_MOE)
        except Exception as e:  # noqa: BLE001
            R.error("latent_moe", label, e)


def st_roundtrip(tmp):
    """kimi_ref.st writes and reads back every supported dtype exactly (BF16 via uint16 << 16)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, generator=gen, dtype=F64)
    ts = {"f64": x, "f32": x.to(F32), "f16": x.to(torch.float16), "bf16": x.to(torch.bfloat16),
          "u8": torch.arange(250, 256, dtype=torch.uint8), "i32": torch.tensor([-7, 0, 2 ** 31 - 1], dtype=torch.int32),
          "i64": torch.tensor([-(2 ** 40), 3], dtype=torch.int64), "scalar": torch.tensor([0.25], dtype=F32)}
    path = os.path.join(tmp, "roundtrip.safetensors")
    st.save_file(ts, path)
    back = st.load_file(path)
    for k, t in ts.items():
        b = back[k]
        want = t.to(F32) if t.dtype in (torch.float16, torch.bfloat16) else t
        assert b.dtype == want.dtype and torch.equal(b, want), (k, b, want)
    assert st.SafeFile(path).info("bf16")[0] == "BF16"
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kimi-ops", required=True, help="path to the kimi-ops binary")
    ap.add_argument("--filter", default=None, help="regex over 'op label' to run a subset")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    ops._selfcheck_mxfp4()
    print("PASS mxfp4 reference self-check on hand-made bytes")
    gen = torch.Generator().manual_seed(a.seed)
    R = Results(a.filter)
    with tempfile.TemporaryDirectory(prefix="kimi-ops-test-") as tmp:
        st_roundtrip(tmp)
        print("PASS safetensors write/read round trip (F64 F32 F16 BF16 U8 I32 I64)")
        run = Runner(os.path.abspath(a.kimi_ops), tmp)
        for fn in (rmsnorm_cases, situ_cases, kda_gate_cases, attn_res_cases, moe_route_cases, mxfp4_cases,
                   mla_cases, latent_moe_cases, kda_cases):
            fn(R, run, gen)
    print("worst relative error per op: " + ", ".join(f"{k} {v:.1e}" for k, v in R.worst.items()))
    print(f"{R.count - R.fail}/{R.count} cases passed")
    return 1 if R.fail else 0


if __name__ == "__main__":
    sys.exit(main())
