"""Prefill DSA indexer: ours vs eager vs default torch.compile of the eager chain, one GPU run.

    python benchmarks/bench_indexer.py [--quick] [--smoke] [--no-compile] [--out results.json]

TFLOP/s counts 2*H*D flops per visible (t, j) pair. The floor is max(flops / bf16 or fp8
peak, bytes / copy bandwidth) with bytes = q + k + weights + outputs read/written once.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CEILINGS, DEVICE, env_line, peak_extra_bytes, table, time_ms, write_json  # noqa: E402
import inductor_dsa  # noqa: E402
from inductor_dsa import formats, reference  # noqa: E402

H, D = 64, 128
CASES = [  # name, T, K, mask, topk
    ("causal T=K=4096 top-512", 4096, 4096, "causal", 512),
    ("causal T=K=8192 top-1024", 8192, 8192, "causal", 1024),
    ("ratio-4 T=16384 K=4096 top-512", 16384, 4096, "ratio4", 512),
]
SMOKE = ("causal T=K=16 top-4", 16, 16, "causal", 4)  # --smoke: CPU, Triton interpreter


def eager_indexer(q, k, w, ks, ke, topk):
    """The eager fallback chain as model code writes it (bf16 throughout)."""
    s = torch.einsum("thd,kd->thk", q, k)
    s = (s.relu() * w.unsqueeze(-1)).sum(1)
    j = torch.arange(k.shape[0], device=q.device)
    visible = (j[None, :] >= ks[:, None]) & (j[None, :] < ke[:, None])
    return s.masked_fill(~visible, float("-inf")).topk(topk, dim=-1)


compiled_indexer = torch.compile(eager_indexer)


def make_case(t, n, mask, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(t, H, D, device=DEVICE, generator=g).bfloat16()
    k = torch.randn(n, D, device=DEVICE, generator=g).bfloat16()
    w = (torch.randn(t, H, device=DEVICE, generator=g) * D**-0.5 * H**-0.5).bfloat16()
    ks, ke = reference.causal_ranges(t, n, DEVICE) if mask == "causal" else reference.ratio_ranges(t, 4, DEVICE)
    return q, k, w, ks, ke


def check_topk(q, k, w, ks, ke, topk, vals, idx, rows=512):
    """Set-with-tolerance check of a top-k against the fp64 oracle on `rows` spread rows."""
    sel = torch.linspace(0, q.shape[0] - 1, min(rows, q.shape[0]), device=DEVICE).long()
    ref = reference.indexer_logits(q[sel], k, w[sel], ks[sel], ke[sel])
    return reference.topk_mismatch(idx[sel], ref, topk) or "ok"


def bench_case(name, t, n, mask, topk, quick, compile_baseline=True):
    q, k, w, ks, ke = make_case(t, n, mask)
    pairs = (ke.clamp(max=n) - ks).clamp(min=0).sum().item()
    flops = 2 * H * D * pairs
    out_bytes = t * topk * 8
    in_bytes = q.numel() * 2 + k.numel() * 2 + w.numel() * 2
    floor = max(flops / CEILINGS["bf16_tflops"] / 1e9, (in_bytes + out_bytes) / CEILINGS["copy_tbps"] / 1e9)
    rows = []
    ours = lambda: inductor_dsa.indexer_topk(q, k, w, topk, k_start=ks, k_end=ke)
    vals, idx = ours()
    check = check_topk(q, k, w, ks, ke, topk, vals, idx)
    runs = [("ours fused logits+top-k", ours),
            ("ours logits only", lambda: inductor_dsa.indexer_logits(q, k, w, k_start=ks, k_end=ke))]
    if not quick:
        runs.append(("eager", lambda: eager_indexer(q, k, w, ks, ke, topk)))
        if compile_baseline:
            runs.append(("torch.compile default", lambda: compiled_indexer(q, k, w, ks, ke, topk)))
    for label, fn in runs:
        ms = time_ms(fn)
        rows.append({"case": name, "impl": label, "ms": ms, "TFLOP/s": flops / ms / 1e9,
                     "peak extra MiB": peak_extra_bytes(fn) / 2**20, "floor ms": floor,
                     "check": check if "fused" in label else ""})
    base = {r["impl"]: r["ms"] for r in rows}
    if "torch.compile default" in base:
        for r in rows:
            r["x vs compile"] = base["torch.compile default"] / r["ms"]
    rows[0]["outputs MiB"] = out_bytes / 2**20
    return rows


def bench_quantised(t, n, topk):
    """FP8 (q fp8 + k fp8 pair) and MXFP4-k variants of the causal case."""
    q, k, w, ks, ke = make_case(t, n, "causal", seed=1)
    pairs = (ke - ks).sum().item()
    flops = 2 * H * D * pairs
    flavor = "fnuz" if torch.version.hip else "fn"
    kf8 = formats.fp8_encode_rows(k, flavor)
    qf8 = q.to(formats.FP8_DTYPES[flavor])
    kmx = formats.mxfp4_encode(k)
    rows = []
    for label, qq, kk in [("fp8 q + fp8 k", qf8, kf8), ("bf16 q + mxfp4 k", q, kmx)]:
        vals, idx = inductor_dsa.indexer_topk(qq, kk, w, topk, k_start=ks, k_end=ke)
        sel = torch.linspace(0, t - 1, 256, device="cuda").long()
        qref = qq[sel] if isinstance(qq, torch.Tensor) else qq
        ref = reference.indexer_logits(qref, kk, w[sel], ks[sel], ke[sel])
        check = reference.topk_mismatch(idx[sel], ref, topk) or "ok"
        for what, fn in [("logits", lambda: inductor_dsa.indexer_logits(qq, kk, w, k_start=ks, k_end=ke)),
                         ("fused top-k", lambda: inductor_dsa.indexer_topk(qq, kk, w, topk, k_start=ks, k_end=ke))]:
            ms = time_ms(fn)
            rows.append({"case": f"causal T=K={t} top-{topk}", "impl": f"ours {what}, {label}", "ms": ms,
                         "TFLOP/s": flops / ms / 1e9, "peak extra MiB": peak_extra_bytes(fn) / 2**20,
                         "check": check})
    return rows


SWEEP = {  # candidates tried with --sweep on the causal T=K=4096 case
    "INDEXER_LOGITS": [(256, 64, 8, 3), (256, 64, 8, 4), (128, 64, 4, 3), (256, 32, 8, 3), (128, 64, 8, 3)],
    "SELECT": [(4, 1024, 512), (8, 1024, 512), (4, 512, 512), (4, 2048, 512), (4, 1024, 1024), (2, 512, 512)],
}


def sweep(t=4096, n=4096, topk=512):
    """Time candidate configs of this target on the causal case; prints one line each."""
    from inductor_dsa.kernels import configs
    target = configs.target_for(torch.device("cuda"))
    q, k, w, ks, ke = make_case(t, n, "causal")
    flops = 2 * H * D * (ke - ks).sum().item()
    calls = {"SELECT": lambda: inductor_dsa.indexer_topk(q, k, w, topk, k_start=ks, k_end=ke),
             "INDEXER_LOGITS": lambda: inductor_dsa.indexer_logits(q, k, w, k_start=ks, k_end=ke)}
    kinds = {"SELECT": configs.SelectConfig, "INDEXER_LOGITS": configs.IndexerConfig}
    for table_name, cands in SWEEP.items():
        registry = getattr(configs, table_name)
        keep = registry[target]
        for cand in cands:
            registry[target] = kinds[table_name](*cand)
            try:
                ms = time_ms(calls[table_name])
                print(f"sweep {registry[target]}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001 - a config that fails to compile is reported
                print(f"sweep {registry[target]}: {type(e).__name__} {e}"[:300])
        registry[target] = keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="ours only, first case")
    ap.add_argument("--smoke", action="store_true", help="one tiny case, ours and eager (CPU test)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile of the eager chain")
    ap.add_argument("--sweep", action="store_true", help="time candidate configs first")
    ap.add_argument("--out")
    args = ap.parse_args()
    print(env_line(), flush=True)
    if args.sweep:
        sweep()
    rows = []
    for case in [SMOKE] if args.smoke else CASES[:1] if args.quick else CASES:
        rows += bench_case(*case, args.quick, not (args.no_compile or args.smoke))
        print(table(rows[-4:], ["case", "impl", "ms", "TFLOP/s", "peak extra MiB"]), flush=True)
    if not args.smoke:
        rows += bench_quantised(4096, 4096, 512)
    cols = ["case", "impl", "ms", "TFLOP/s", "x vs compile", "peak extra MiB", "outputs MiB", "floor ms", "check"]
    print(table(rows, cols))
    write_json(args.out, {"env": env_line(), "ceilings": CEILINGS, "rows": rows})


if __name__ == "__main__":
    main()
