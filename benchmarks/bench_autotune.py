"""Autotuning (issue 23): per kernel family and one V4 shape bucket, the tuning time and shipped vs tuned speed.

    python benchmarks/bench_autotune.py [--smoke] [--cache-dir DIR] [--out results.json]

For each case: the op with the shipped config (autotune off, JIT warm), timed; then autotune on with an
empty cache (a fresh temporary dir unless --cache-dir): the first call tunes (wall time, compiles of
the candidates included), the tuned op is timed, its result checked against the shipped one
(``autotune.agrees``: top-k indices identical), and the first call after forgetting the in-memory
winners (what a second process pays: a disk cache read) is timed. Times: median ms of CUDA-graph
replays (common.graphed, then common.time_ms), so launch overhead does not blur kernel speed; the
tuner times its candidates the same way (autotune.bench). Prints a markdown table and every candidate's time.
``--smoke``: tiny sizes on the CPU under Triton's interpreter (checks the script, measures nothing).
A few minutes at most on one H200 (most of it Triton compiling the candidates).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEVICE, env_line, graphed, table, time_ms, write_json  # noqa: E402
import inductor_dsa  # noqa: E402
from inductor_dsa import formats  # noqa: E402
from inductor_dsa.kernels import autotune  # noqa: E402


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cases(smoke: bool):
    """(family, case name, zero-argument call) per family; inputs built once per case."""
    g = torch.Generator().manual_seed(0)
    dev = lambda x: x.to(DEVICE)
    t, k_len, h, d, topk = (16, 96, 8, 32, 8) if smoke else (4096, 4096, 64, 128, 512)
    q = dev(torch.randn(t, h, d, generator=g).bfloat16())
    k = dev(torch.randn(k_len, d, generator=g))
    k_mx = tuple(dev(x) for x in formats.mxfp4_encode(k.cpu()))
    w = dev(torch.randn(t, h, generator=g))
    ke = dev(torch.arange(k_len - t + 1, k_len + 1, dtype=torch.int32))
    ks = torch.zeros_like(ke)
    yield ("indexer_logits", f"bf16 q, MXFP4 k, causal T=K={k_len}, logits",
           lambda: inductor_dsa.indexer_logits(q, k_mx, w, k_start=ks, k_end=ke))
    logits = dev(torch.randn(t, k_len, generator=g))
    yield "select", f"logits_topk [{t}, {k_len}] causal top-{topk}", lambda: inductor_dsa.logits_topk(
        logits, topk, k_start=ks, k_end=ke)
    rows, n_long = (2, 600) if smoke else (64, 65536)
    long = dev(torch.randn(rows, n_long, generator=g))
    yield "select", f"logits_topk [{rows}, {n_long}] top-{topk} (chunked)", lambda: inductor_dsa.logits_topk(long, topk)
    b, ctx_len, ptopk = (3, 200, 16) if smoke else (64, 32768, 512)
    pages = -(-ctx_len // formats.PAGE_ROWS)
    payload, scale = formats.encode_rows(torch.randn(b * pages * formats.PAGE_ROWS, d, generator=g), "mxfp4", "fn")
    cache = dev(formats.pack_pages(payload, scale))
    bt = dev(torch.randperm(b * pages, generator=g, dtype=torch.int32).view(b, pages))
    ctx = dev(torch.full((b,), ctx_len - 3, dtype=torch.int32))
    pq, pw = dev(torch.randn(b, 1, h, d, generator=g).bfloat16()), dev(torch.randn(b, 1, h, generator=g))
    yield "paged", f"paged_indexer_topk MXFP4 B={b} L={ctx_len} N=1 top-{ptopk}", lambda: inductor_dsa.paged_indexer_topk(
        pq, cache, pw, bt, ctx, ptopk, check_values=False)
    sb, sn, sh, sd, stopk = (1, 40, 16, 32, 48) if smoke else (64, 8320, 64, 512, 1152)
    aq = dev(torch.randn(sb, 1, sh, sd, generator=g).bfloat16())
    kv = dev(torch.randn(sb, sn, sd, generator=g).bfloat16())
    idx = dev(torch.randint(0, sn, (sb, 1, stopk), generator=g, dtype=torch.int32))
    sink = dev(torch.rand(sh, generator=g) + 1)
    yield ("sparse_attention", f"decode B={sb} H={sh} D={sd} N={sn} top-{stopk}",
           lambda: inductor_dsa.sparse_attention(aq, kv, idx, sink=sink, return_lse=True, check_indices=False))


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _replayed(call):
    """call as a CUDA-graph replay on the GPU (the config in force now is the one captured)."""
    return graphed(call) if DEVICE == "cuda" else call


def run_case(family: str, name: str, call) -> tuple[dict, list[str]]:
    autotune.autotune(False)
    shipped_out = _as_tuple(call())  # also compiles the shipped config
    shipped_ms = time_ms(_replayed(call))
    autotune.autotune(True)
    autotune.clear()
    _sync()
    t0 = time.perf_counter()
    tuned_out = _as_tuple(call())
    _sync()
    tune_s = time.perf_counter() - t0
    choices = [c for c in autotune.used() if c.family == family and c.status == "tuned"]
    tuned_ms = time_ms(_replayed(call))
    autotune.clear()  # a second process: winners come from the disk cache
    _sync()
    t0 = time.perf_counter()
    call()
    _sync()
    reload_ms = (time.perf_counter() - t0) * 1e3
    reloaded = [c for c in autotune.used() if c.family == family]
    autotune.autotune(False)
    main = choices[-1] if choices else None  # the case's bucket (earlier ones: none here)
    row = dict(family=family, case=name, shipped_ms=shipped_ms, tuned_ms=tuned_ms, speedup=shipped_ms / tuned_ms,
               winner=main.winner if main else "-", tune_s=tune_s, reload_ms=reload_ms,
               from_disk="yes" if reloaded and all(c.status == "cached" for c in reloaded) else "NO",
               timed=len(main.times) if main else 0, rejected=len(main.rejected) if main else 0,
               check="ok" if autotune.agrees(shipped_out, tuned_out) else "FAIL")
    detail = [f"  {c.family} {c.key}: " + ", ".join(f"{n} {ms:.4g} ms" for n, ms in c.times.items())
              + "".join(f"; rejected {n}: {why}" for n, why in c.rejected.items()) for c in choices]
    return row, detail


COLS = ["family", "case", "shipped_ms", "tuned_ms", "speedup", "winner", "tune_s", "reload_ms", "from_disk",
        "timed", "rejected", "check"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU, Triton's interpreter)")
    ap.add_argument("--cache-dir", help="Inductor cache dir to tune into (default: a fresh temporary dir)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="inductor_dsa_autotune_")
    smoke = args.smoke or DEVICE == "cpu"
    print(f"# autotune: {env_line()}; cache {autotune.cache_dir()}", flush=True)
    rows, details, t_all = [], [], time.perf_counter()
    for family, name, call in cases(smoke):
        row, detail = run_case(family, name, call)
        rows.append(row)
        details += detail
        print(f"{family}: {name}: shipped {row['shipped_ms']:.4g} ms, tuned {row['tuned_ms']:.4g} ms "
              f"({row['winner']}), tuning {row['tune_s']:.3g} s", flush=True)
    print()
    print(table(rows, COLS))
    print("\ncandidates (ms, median of graph replays; the shipped config first):")
    print("\n".join(details))
    print(f"\ntotal {time.perf_counter() - t_all:.1f} s" + ("  (CPU smoke: times mean nothing)" if smoke else ""))
    write_json(args.out, dict(env=env_line(), smoke=smoke, rows=rows, details=details))
    return 0 if all(r["check"] == "ok" and r["from_disk"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
