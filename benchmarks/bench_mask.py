"""Masks given as data vs the range form of the fused indexer top-k (issue 22: mask / range <= 1.15).

    python benchmarks/bench_mask.py [--smoke]

T = K = 8192, top-1024, H = 64, D = 128, bf16; causal visibility three ways: k_start / k_end
ranges, a bool [T, K] mask, an additive [T, K] fp32 mask (0 / -inf): their rows are intervals with
no bias (the logits kernel reads one cached value per row instead of the mask), so their indices must equal the range form's. Then
two masks the kernel must read tile by tile: the bool mask with every 97th column hidden, and the
additive mask with a random bias on the shown columns (timed only; their values are tested on the
oracle in tests/). Each timed as a CUDA-graph replay (``graphed``); --smoke (or no GPU):
T = K = 16 top-4 on the CPU interpreter, not a measurement.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEVICE, env_line, graphed, time_ms  # noqa: E402
import inductor_dsa  # noqa: E402
from inductor_dsa import reference  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU test)")
    args = ap.parse_args(argv)
    t, topk, h, d = (16, 4, 4, 64) if args.smoke or DEVICE == "cpu" else (8192, 1024, 64, 128)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(t, h, d, generator=gen).bfloat16().to(DEVICE)
    k = torch.randn(t, d, generator=gen).bfloat16().to(DEVICE)
    w = torch.randn(t, h, generator=gen).bfloat16().to(DEVICE)
    ks, ke = (x.to(DEVICE) for x in reference.causal_ranges(t, t))
    tril = torch.ones(t, t, dtype=torch.bool, device=DEVICE).tril()
    holes = tril & (torch.arange(t, device=DEVICE) % 97 != 0)
    bias = torch.randn(t, t, generator=gen).to(DEVICE)
    forms = {
        "range": dict(k_start=ks, k_end=ke),
        "bool mask": dict(mask=tril),
        "additive mask": dict(mask=torch.zeros(t, t, device=DEVICE).masked_fill(~tril, float("-inf"))),
        "bool, holes": dict(mask=holes),
        "additive, biased": dict(mask=bias.masked_fill(~tril, float("-inf"))),
    }
    same_as_range = {"range", "bool mask", "additive mask"}  # the masks whose rows are plain intervals
    want = inductor_dsa.indexer_topk(q, k, w, topk, **forms["range"])[1]
    print(env_line())
    base = None
    for name, kw in forms.items():
        def call(kw=kw):
            return inductor_dsa.indexer_topk(q, k, w, topk, **kw)
        got = call()[1]
        assert name not in same_as_range or torch.equal(got, want), f"{name}: indices differ from the range form"
        ms = time_ms(graphed(call) if DEVICE == "cuda" else call)
        base = base or ms
        print(f"T=K={t} top-{topk} {name:16} {ms:9.3f} ms  ratio to range {ms / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
