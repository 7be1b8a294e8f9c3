"""Whole-model check: kimi-logits against the float64 reference forward pass in kimi_ref/model.py.

Usage: /usr/bin/python3 tests/reference/test_model.py --kimi-logits build/bin/kimi-logits --model DIR
                                                      [--tokens N] [--seed S] [--tol 2e-3]

Draws N random token ids (seeded), computes the reference logits once (single prefill, float64), then runs
kimi-logits as (a) one prefill, (b) chunked prefills with several split patterns (a single-token first chunk,
splits at non-multiples of 64, a lone last token), (c) decode, one token per step. For each run it compares the
log-softmax rows: max |logprob_ref - logprob_engine| over all positions and the whole vocabulary must be
<= tol (DESIGN.md: fp32 activations keep logits within 2e-3 logprob of a float64 reference); it also reports
the argmax agreement. For K3 checkpoints it checks that wiring AttnRes as a plain residual (a deliberately wrong
reference) moves the logprobs by far more than tol, i.e. this test would catch that bug.
Exit status 1 on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_ref import st  # noqa: E402
from kimi_ref.model import ReferenceModel  # noqa: E402

F64 = torch.float64
# A plain-residual wiring must move the logprobs by at least this many times the tolerance for the test to be
# able to tell the two models apart with a wide margin.
PLAIN_RESIDUAL_MIN_FACTOR = 25.0


def split_patterns(T):
    """Chunk-size lists for --chunks (the remainder becomes the last chunk); each clipped to T."""
    raw = [
        [1],                      # single-token first chunk, then everything else
        [1, 63, 2],               # first chunk 1, a 64-token boundary crossed mid-chunk
        [37, 50],                 # non-multiples of 64
        [64, 1],                  # exactly one 64-chunk, then a single token
        [5, 7, 11, 13, 17, 19, 23, 29],
        [T - 1] if T > 1 else [],  # lone last token
    ]
    out = []
    for p in raw:
        q, s = [], 0
        for c in p:
            if c <= 0 or s + c >= T:
                break
            q.append(c)
            s += c
        if q and q not in out:
            out.append(q)
    return out


def run_logits(exe, model, toks, out, extra):
    cmd = [exe, "--model", model, "--tokens", ",".join(map(str, toks)), "--out", out] + extra
    for _ in range(6):
        if os.path.exists(exe):
            break
        time.sleep(5)   # the binary may be being rebuilt by another developer
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    logits = st.SafeFile(out).get("logits").to(F64)
    return logits, time.time() - t0


def compare(ref_lp, logits):
    if tuple(logits.shape) != tuple(ref_lp.shape):
        return float("inf"), 0, f"shape {tuple(logits.shape)} != {tuple(ref_lp.shape)}"
    if not torch.isfinite(logits).all():
        return float("inf"), 0, "non-finite logits"
    lp = torch.log_softmax(logits, -1)
    err = (lp - ref_lp).abs().max().item()
    agree = int((lp.argmax(-1) == ref_lp.argmax(-1)).sum().item())
    return err, agree, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kimi-logits", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=150, help="sequence length (default 150: crosses two 64-chunks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=2e-3, help="max |logprob difference| (DESIGN.md: 2e-3)")
    a = ap.parse_args()
    exe = os.path.abspath(a.kimi_logits)

    t0 = time.time()
    ref_model = ReferenceModel(a.model)
    cfg = ref_model.cfg
    gen = torch.Generator().manual_seed(a.seed)
    toks = torch.randint(0, cfg.vocab, (a.tokens,), generator=gen).tolist()
    T = len(toks)
    ref = ref_model.forward(toks)
    ref_lp = torch.log_softmax(ref, -1)
    print(f"model {a.model} ({cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden}), {T} tokens, "
          f"seed {a.seed}; reference forward {time.time() - t0:.1f}s", flush=True)

    fails = 0
    runs = [("prefill", [])]
    runs += [(f"chunks {','.join(map(str, p))}", ["--chunks", ",".join(map(str, p))]) for p in split_patterns(T)]
    runs.append(("decode", ["--decode"]))
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="kimi-logits-test-") as tmp:
        for i, (name, extra) in enumerate(runs):
            try:
                logits, secs = run_logits(exe, a.model, toks, os.path.join(tmp, f"l{i}.safetensors"), extra)
                err, agree, why = compare(ref_lp, logits)
            except Exception as e:  # noqa: BLE001
                err, agree, why, secs = float("inf"), 0, str(e), 0.0
            ok = err <= a.tol
            worst = max(worst, err)
            fails += 0 if ok else 1
            print(f"{'PASS' if ok else 'FAIL'} {name:40s} max|dlogprob| {err:.2e} (tol {a.tol:.0e})  "
                  f"argmax {agree}/{T}  [{secs:.1f}s] {why}", flush=True)

    if cfg.k3:
        plain = ReferenceModel(a.model, plain_residual=True).forward(toks)
        d = (torch.log_softmax(plain, -1) - ref_lp).abs().max().item()
        agree = int((plain.argmax(-1) == ref.argmax(-1)).sum().item())
        ok = d >= PLAIN_RESIDUAL_MIN_FACTOR * a.tol
        fails += 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'} {'plain-residual K3 differs from AttnRes':40s} max|dlogprob| {d:.2e} "
              f"(must be >= {PLAIN_RESIDUAL_MIN_FACTOR * a.tol:.0e})  argmax {agree}/{T}", flush=True)

    print(f"worst max|dlogprob| {worst:.2e}; {'FAIL' if fails else 'PASS'} ({fails} failing checks); "
          f"total {time.time() - t0:.1f}s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
