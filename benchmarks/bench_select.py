"""The selection engine: ``logits_topk`` against ``torch.topk`` on the same fp32 logits, and the
fused prefill op (``indexer_topk``) against its logits-only kernel, one GPU run.

    python benchmarks/bench_select.py [--smoke] [--sweep] [--no-fused] [--out results.json]

Logits are random normal fp32 with masked columns at -inf (torch.topk's input); our op gets
the per-row ranges instead. Each call is timed plainly (do_bench: launch gaps included) and
replayed from a CUDA graph ("graph"). Floor: the visible logits read once plus the outputs
written once, at the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CEILINGS, DEVICE, env_line, graphed, peak_extra_bytes, table, time_ms, write_json  # noqa: E402
import inductor_dsa  # noqa: E402
from inductor_dsa import formats, reference  # noqa: E402
from inductor_dsa.kernels import configs, select_launch  # noqa: E402

SELECT_CASES = [  # name, T, K, mask, topk
    ("[4096, 4096] causal", 4096, 4096, "causal", 512),
    ("[8192, 8192] causal", 8192, 8192, "causal", 1024),
    ("[16384, 4096] ratio-4", 16384, 4096, "ratio4", 512),
    ("[2048, 65536] causal", 2048, 65536, "causal", 2048),
    ("[64, 65536]", 64, 65536, "all", 512),
    ("[1, 131072]", 1, 131072, "all", 2048),
    ("[1, 1048576]", 1, 1048576, "all", 2048),
]
FUSED_CASES = [  # name, T, K, mask, topk (H = 64, D = 128)
    ("causal T=K=4096 top-512", 4096, 4096, "causal", 512),
    ("causal T=K=8192 top-1024", 8192, 8192, "causal", 1024),
    ("ratio-4 T=16384 K=4096 top-512", 16384, 4096, "ratio4", 512),
    ("T=2048 K=65536 top-2048", 2048, 65536, "causal", 2048),
]
SMOKE_SELECT = [("[5, 300] causal", 5, 300, "causal", 8), ("[2, 700]", 2, 700, "all", 16)]
SMOKE_FUSED = [("causal T=K=16 top-4", 16, 16, "causal", 4)]
H, D = 64, 128


def ranges(t, n, mask):
    if mask == "causal":
        return reference.causal_ranges(t, n, DEVICE)
    if mask == "ratio4":
        return reference.ratio_ranges(t, 4, DEVICE)
    return (torch.zeros(t, dtype=torch.int32, device=DEVICE), torch.full((t,), n, dtype=torch.int32, device=DEVICE))


def masked_logits(logits, ks, ke):
    """torch.topk's input: the columns outside each row's range at -inf."""
    return logits.masked_fill(~reference.visible_mask(ks, ke, logits.shape[1]), float("-inf"))


def times(fn) -> tuple[float, float]:
    """(plain ms, CUDA-graph replay ms); replay is NaN on the CPU."""
    plain = time_ms(fn)
    return plain, (time_ms(graphed(fn)) if DEVICE == "cuda" else float("nan"))


def check_select(vals, idx, logits, topk) -> str:
    """Our values equal torch.topk's (finite part, both sorted) and our indices point at them."""
    want = torch.topk(logits, topk, dim=-1).values
    fin = torch.isfinite(want)
    if not torch.equal(torch.where(fin, want, 0), torch.where(fin, vals, 0)):
        return "values differ"
    got = torch.gather(logits, 1, idx.long().clamp(min=0))
    if not torch.equal(torch.where(fin, got, 0), torch.where(fin, vals, 0)):
        return "indices do not point at the values"
    return "ok"


def bench_select(name, t, n, mask, topk):
    g = torch.Generator(device=DEVICE).manual_seed(0)
    ks, ke = ranges(t, n, mask)
    masked = masked_logits(torch.randn(t, n, device=DEVICE, generator=g), ks, ke)
    ours = lambda: inductor_dsa.logits_topk(masked, topk, k_start=ks, k_end=ke)
    torch_fn = lambda: torch.topk(masked, topk, dim=-1)
    check = check_select(*ours(), masked, topk)
    visible = (ke.long() - ks.long()).clamp(min=0).sum().item()
    floor = (visible * 4 + t * topk * 8) / CEILINGS["copy_tbps"] / 1e9
    ours_ms, ours_g = times(ours)
    torch_ms, torch_g = times(torch_fn)
    return {"case": f"{name} k={topk}", "ours ms": ours_ms, "ours graph ms": ours_g, "torch.topk ms": torch_ms,
            "torch.topk graph ms": torch_g, "x vs torch": torch_ms / ours_ms, "x vs torch (graph)": torch_g / ours_g,
            "floor ms": floor, "peak extra MiB ours": peak_extra_bytes(ours) / 2**20, "check": check}


def bench_fused(name, t, n, mask, topk):
    g = torch.Generator(device=DEVICE).manual_seed(1)
    q = torch.randn(t, H, D, device=DEVICE, generator=g).bfloat16()
    k = torch.randn(n, D, device=DEVICE, generator=g).bfloat16()
    w = (torch.randn(t, H, device=DEVICE, generator=g) * D**-0.5 * H**-0.5).bfloat16()
    ks, ke = ranges(t, n, mask)
    flavor = "fnuz" if torch.version.hip else "fn"
    forms = [("bf16", q, k), ("fp8", q.to(formats.FP8_DTYPES[flavor]), formats.fp8_encode_rows(k, flavor)),
             ("bf16 q + mxfp4 k", q, formats.mxfp4_encode(k))]
    rows = []
    for form, qq, kk in forms:
        fused = lambda: inductor_dsa.indexer_topk(qq, kk, w, topk, k_start=ks, k_end=ke)
        logits = lambda: inductor_dsa.indexer_logits(qq, kk, w, k_start=ks, k_end=ke)
        sel = torch.linspace(0, t - 1, min(t, 128), device=DEVICE).long()
        ref = reference.indexer_logits(qq[sel], kk, w[sel], ks[sel], ke[sel])
        check = reference.topk_mismatch(fused()[1][sel], ref, topk) or "ok"
        f_ms, f_g = times(fused)
        l_ms, l_g = times(logits)
        rows.append({"case": f"{name} {form}", "fused ms": f_ms, "fused graph ms": f_g, "logits ms": l_ms,
                     "logits graph ms": l_g, "fused / logits": f_ms / l_ms, "fused / logits (graph)": f_g / l_g,
                     "peak extra MiB fused": peak_extra_bytes(fused) / 2**20, "check": check})
    return rows


SWEEP = [  # SelectConfig fields tried with --sweep (per-row fields only on the one-program-per-row cases,
    # filter fields only on the others)
    dict(), dict(sort32=False), dict(sample_bits=8), dict(sample=1024), dict(row_sort_warps=4),
    dict(row_max=4096, sample=512), dict(filter_rows=1 << 30),
    dict(rank_rows=0), dict(rank_passes=1), dict(rank_passes=3), dict(rank_tile=1024),
]
PER_ROW = {"num_warps", "ch", "bits", "packed", "prefetch", "sort_apart"}  # fields of select_kernel alone
FILTER = {"filter_rows", "sample", "sample_bits", "sample_z", "cand_factor", "filter_chunk", "filter_step",
          "filter_warps"}
RANKED = {"rank_rows", "rank_passes", "rank_cap", "rank_slice", "rank_tile", "rank_warps"}  # few long rows


def kernel_times(fn, calls=5) -> dict:
    """GPU microseconds per call of each kernel fn launches (torch.profiler, ``calls`` calls)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name] = per.get(ev.name, 0.0) + ev.device_time / calls
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def _line(per: dict) -> str:
    return ", ".join(f"{k[:40]} {v:.1f} us" for k, v in per.items())


def profile(cases):
    """Per-kernel GPU time of each logits_topk case, and of the paged decode top-k, whose chunk
    selects and merge (paged_select / filter / final kernels) are the engine's share there."""
    for name, t, n, mask, topk in cases:
        ks, ke = ranges(t, n, mask)
        logits = torch.randn(t, n, device=DEVICE)
        per = kernel_times(lambda: inductor_dsa.logits_topk(logits, topk, k_start=ks, k_end=ke))
        print(f"profile {name} k={topk}: {_line(per)}", flush=True)
    from bench_paged_indexer import make_case
    for b, length, topk in [(64, 32768, 512), (128, 65536, 1024)]:
        q, cache, w, bt, ctx = make_case(b, length)
        per = kernel_times(lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk, check_values=False))
        sel = sum(v for k, v in per.items() if "scores" not in k)
        print(f"profile paged B={b} L={length} top-{topk}: select + merge {sel:.1f} of {sum(per.values()):.1f} us "
              f"({sel / sum(per.values()):.0%}): {_line(per)}", flush=True)


def sweep(cases):
    target = configs.target_for(torch.device(DEVICE))
    keep = configs.SELECT[target]
    for name, t, n, mask, topk in cases:
        ks, ke = ranges(t, n, mask)
        logits = torch.randn(t, n, device=DEVICE)
        masked = masked_logits(logits, ks, ke)
        for change in SWEEP:
            long_rows = select_launch.chunked(t, n, keep)
            if change and set(change) <= (PER_ROW if long_rows else FILTER | RANKED):
                continue
            configs.SELECT[target] = dataclasses.replace(keep, **change)
            try:
                fn = lambda: inductor_dsa.logits_topk(logits, topk, k_start=ks, k_end=ke)
                check = check_select(*fn(), masked, topk)
                p, gr = times(fn)
                print(f"sweep {name} k={topk} {change}: {p:.4f} ms, graph {gr:.4f} ms, {check}", flush=True)
            except Exception as e:  # noqa: BLE001 - a config that fails to compile is reported
                print(f"sweep {name} {change}: {type(e).__name__} {e}"[:300], flush=True)
        configs.SELECT[target] = keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny cases (CPU, Triton interpreter)")
    ap.add_argument("--sweep", action="store_true", help="time SelectConfig candidates first")
    ap.add_argument("--no-fused", action="store_true", help="the select table only")
    ap.add_argument("--fused-only", action="store_true", help="the fused prefill table only")
    ap.add_argument("--profile", action="store_true", help="per-kernel GPU times of each select case")
    ap.add_argument("--only", help="select cases whose name contains this")
    ap.add_argument("--out")
    args = ap.parse_args()
    print(env_line(), flush=True)
    sel_cases = [c for c in (SMOKE_SELECT if args.smoke else SELECT_CASES) if not args.only or args.only in c[0]]
    if args.profile:
        profile(sel_cases)
    if args.sweep:
        sweep(sel_cases)
    rows = []
    for case in [] if args.fused_only else sel_cases:
        rows.append(bench_select(*case))
        print(rows[-1], flush=True)
    cols = ["case", "ours ms", "ours graph ms", "torch.topk ms", "torch.topk graph ms", "x vs torch",
            "x vs torch (graph)", "floor ms", "peak extra MiB ours", "check"]
    fused = []
    if not args.no_fused:
        for case in SMOKE_FUSED if args.smoke else FUSED_CASES:
            fused += bench_fused(*case)
            print(fused[-1], flush=True)
    if rows:
        print(table(rows, cols))
    if fused:
        print(table(fused, ["case", "fused ms", "fused graph ms", "logits ms", "logits graph ms", "fused / logits",
                            "fused / logits (graph)", "peak extra MiB fused", "check"]))
    write_json(args.out, {"env": env_line(), "ceilings": CEILINGS, "select": rows, "fused": fused,
                          "rows": run_rows(rows, fused)})


def run_rows(select_rows, fused_rows) -> list[dict]:
    """The tables as benchmarks/run.py reads them: torch.topk plays the eager baseline."""
    out = []
    for r in select_rows:
        out.append(dict(case=r["case"], impl="ours logits_topk", ms=r["ours ms"], floor_ms=r["floor ms"], check=r["check"]))
        out.append(dict(case=r["case"], impl="eager torch.topk", ms=r["torch.topk ms"]))
    for r in fused_rows:
        out.append(dict(case=r["case"], impl="ours fused logits+top-k", ms=r["fused ms"], check=r["check"]))
        out.append(dict(case=r["case"], impl="ours logits only", ms=r["logits ms"]))
    return out


if __name__ == "__main__":
    main()
