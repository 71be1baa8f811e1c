"""Hardware profile of one kernel with Nsight Compute: a case to run under ``ncu``, and a summary of
its per-instruction stall samples (how BENCHMARKS.md's profiles were read).

    ncu --clock-control none --set full -k regex:paged_scores --launch-skip 2 --launch-count 1 \\
        -o r python benchmarks/ncu_profile.py case paged 1 131072 512
    ncu --import r.ncu-rep --page details                               # the sections
    ncu --import r.ncu-rep --page source --csv --print-source sass > r.csv
    python benchmarks/ncu_profile.py stalls r.csv

``case paged B L TOPK`` calls ``paged_indexer_topk`` on bench_paged_indexer's inputs and ``case
select T N TOPK`` ``logits_topk`` on random fp32 logits (row t sees its first (t + 1) N / T columns),
``calls`` times each (the first compiles: skip it with ``--launch-skip``). ``stalls`` prints the
warp stall samples by reason, split into the kernel's prologue, its main loop (the longest backward
branch) and what follows; a loop holding a wgmma is split further into the work before
``WARPGROUP.ARRIVE`` (loads, decode), the MMA wait and the epilogue; then the top instructions.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_source(path: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of an ``ncu --page source --csv --print-source sass`` export (its first line
    names the kernel)."""
    rows = list(csv.reader(Path(path).read_text().splitlines()))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[start], [r for r in rows[start + 1:] if len(r) > 2]


def main_loop(rows, ix) -> tuple[int, int] | None:
    """(first, last) address of the longest backward branch's body, or None."""
    back = []
    for r in rows:
        m = re.search(r"BRA (0x[0-9a-f]+)", r[ix["Source"]])
        span = m and (int(m.group(1), 16), int(r[ix["Address"]], 16))
        if span and span[0] < span[1]:
            back.append(span)
    return max(back, key=lambda span: span[1] - span[0], default=None)


def summarise(path: str, top: int = 12) -> dict:
    """Stall samples of a source export: totals by reason, by region and the ``top`` instructions."""
    header, rows = read_source(path)
    ix = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, h: int(r[ix[h]]) if r[ix[h]] not in ("", "-") else 0
    total = sum(num(r, SAMPLES) for r in rows)
    by_reason = {h[6:]: sum(num(r, h) for r in rows) for h in reasons}
    loop = main_loop(rows, ix)
    regions = dict.fromkeys(["prologue", "loop: loads and decode", "loop: MMA wait", "loop: epilogue", "after"], 0)
    phase = "loop: loads and decode"
    for r in rows:
        a, src = int(r[ix["Address"]], 16), r[ix["Source"]]
        if loop is None or a < loop[0]:
            regions["prologue"] += num(r, SAMPLES)
            continue
        if a > loop[1]:
            regions["after"] += num(r, SAMPLES)
            continue
        if "WARPGROUP.ARRIVE" in src:
            phase = "loop: MMA wait"
        regions[phase] += num(r, SAMPLES)
        if "WARPGROUP.DEPBAR" in src:
            phase = "loop: epilogue"
    hot = sorted(rows, key=lambda r: -num(r, SAMPLES))[:top]
    return dict(total=total, reasons=dict(sorted(by_reason.items(), key=lambda kv: -kv[1])), regions=regions,
                loop=loop, top=[(num(r, SAMPLES), r[ix["Source"]].strip(),
                                 max(reasons, key=lambda h: num(r, h))[6:]) for r in hot])


def print_summary(s: dict) -> None:
    pct = lambda v: f"{100 * v / max(s['total'], 1):5.1f}%"
    print(f"{s['total']} stall samples; main loop {tuple(map(hex, s['loop'])) if s['loop'] else 'not found'}")
    for name, v in s["regions"].items():
        print(f"  {name:24} {v:7} {pct(v)}")
    print("by reason:")
    for name, v in list(s["reasons"].items())[:10]:
        print(f"  {name:24} {v:7} {pct(v)}")
    print("top instructions (samples, reason):")
    for v, src, why in s["top"]:
        print(f"  {v:7} {pct(v)}  {why:16} {src[:70]}")


def run_case(kind: str, a: int, b: int, topk: int, calls: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from common import DEVICE  # before inductor_dsa: the interpreter without a GPU
    import inductor_dsa
    if kind == "paged":
        from bench_paged_indexer import make_case
        q, cache, w, bt, ctx = make_case(a, b)
        fn = lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk, check_values=False)
    else:
        logits = torch.randn(a, b, device=DEVICE)
        ke = ((torch.arange(a, device=DEVICE) + 1) * b // a).int()
        fn = lambda: inductor_dsa.logits_topk(logits, topk, k_start=torch.zeros_like(ke), k_end=ke)
    for _ in range(calls):
        vals, idx = fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    print(f"{kind} {a} {b} top-{topk}: {calls} calls, output {tuple(idx.shape)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case", help="run one case (under ncu)")
    c.add_argument("kind", choices=["paged", "select"])
    c.add_argument("a", type=int, help="B (paged) or T (select)")
    c.add_argument("b", type=int, help="L (paged) or N (select)")
    c.add_argument("topk", type=int)
    c.add_argument("--calls", type=int, default=4)
    st = sub.add_parser("stalls", help="summarise an ncu source-page CSV export")
    st.add_argument("csv")
    st.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    if args.cmd == "case":
        run_case(args.kind, args.a, args.b, args.topk, args.calls)
    else:
        print_summary(summarise(args.csv, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
