"""Tensor-parallel DSA indexer: ours vs eager vs default torch.compile, one process per GPU.

    python benchmarks/bench_tp_indexer.py                      # 2 GPUs (NCCL), V4-Pro sizes
    torchrun --nproc-per-node 2 benchmarks/bench_tp_indexer.py  # the same under torchrun
    python benchmarks/bench_tp_indexer.py --cpu                # 2 CPU ranks (gloo), tiny sizes

The module is ``tests/pass_corpus.TPIndexer`` (the official V4 indexer prefill branch with its
heads split over ranks: partial scores, ``dist.all_reduce``, ratio mask, top-k, -1 marking),
the one the graph-pass tests check. Defaults: V4-Pro indexer, H=64 heads over 2 ranks, D=128,
S=16384 tokens, ratio 4 (K=4096 compressed keys), top-1024, bf16. Every rank runs the same
number of iterations (the collective pairs them); times are rank 0's median over iterations.
Checks: ours swapped the chain (``inductor_dsa.report()``), and ours' and eager's indices are a
valid top-k of the float64 oracle (all heads, one device) on ``--check-rows`` spread rows.
On a CPU without TRITON_INTERPRET=1 the inductor_dsa ops run their float64 reference: the
--cpu run exercises the code path, its timings mean nothing.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import inductor_dsa  # noqa: E402
from inductor_dsa import reference  # noqa: E402
from common import env_line, table  # noqa: E402
from pass_corpus import TPIndexer  # noqa: E402

PATTERN = "indexer_topk_all_reduce"
SIZES = {  # dim, q_dim, heads, head_dim, seqlen, ratio, topk
    "v4-pro": (7168, 1536, 64, 128, 16384, 4, 1024),
    "cpu": (40, 24, 8, 32, 64, 4, 8),
}


def _inputs(full: TPIndexer, seqlen, dtype, device):
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, seqlen, full.weights_proj.in_features, generator=g, device=device).to(dtype)
    qr = torch.randn(1, seqlen, full.wq_b.in_features, generator=g, device=device).to(dtype)
    kv = torch.randn(1, seqlen // full.ratio, full.head_dim, generator=g, device=device).to(dtype)
    return x, qr, kv


def oracle_logits(full: TPIndexer, x, qr, kv, rows):
    """float64 logits [len(rows), K] of the full (all heads) indexer, ratio mask as -inf."""
    f64 = torch.float64
    q = (qr[0, rows].to(f64) @ full.wq_b.weight.to(f64).t()).unflatten(-1, (full.n_heads, full.head_dim))
    w = (x[0, rows].to(f64) @ full.weights_proj.weight.to(f64).t()) * (full.softmax_scale * full.n_heads ** -0.5)
    ks, ke = reference.ratio_ranges(x.shape[1], full.ratio, x.device)
    return reference.indexer_logits(q, kv[0], w, ks[rows], ke[rows])


def _time(fn, iters, warmup, device) -> float:
    """Median ms per call; every rank runs the same count, a barrier before each call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def run_rank(rank, world, args):
    device = torch.device("cpu") if args.cpu else torch.device("cuda", rank % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.float32 if args.cpu else torch.bfloat16
    dim, q_dim, heads, head_dim, seqlen, ratio, topk = SIZES["cpu" if args.cpu else "v4-pro"]
    seqlen = args.seqlen or seqlen
    torch.manual_seed(0)
    full = TPIndexer(dim, q_dim, heads, head_dim, ratio, topk, max_len=seqlen).to(device, dtype)
    m = full.shard(world, rank)
    inputs = _inputs(full, seqlen, dtype, device)
    rows = torch.linspace(0, seqlen - 1, min(args.check_rows, seqlen), device=device).long()
    ref = oracle_logits(full, *inputs, rows)
    impls = {"eager": m,
             "torch.compile": torch.compile(copy.deepcopy(m)),
             "inductor_dsa": torch.compile(copy.deepcopy(m), backend=inductor_dsa.backend)}
    inductor_dsa.lowering.reset()
    results = []
    with torch.no_grad():
        for name, fn in impls.items():
            idx = fn(*inputs)
            ms = _time(lambda: fn(*inputs), args.iters, args.warmup, device)
            check = reference.topk_mismatch(idx[0, rows], ref, idx.shape[-1], rel_tol=3e-2) or "ok"
            results.append(dict(impl=name, ms=ms, check=check))
    swapped = inductor_dsa.lowering.counters.get(PATTERN, 0)
    if rank == 0:
        base = results[1]["ms"]
        for r in results:
            r["x vs compile"] = base / r["ms"]
            r["case"] = f"TP {world} ranks H={heads} D={head_dim} S={seqlen} ratio {ratio} top-{topk}"
        print(env_line(), f"{world} ranks ({'gloo, CPU' if args.cpu else 'NCCL'})")
        print(inductor_dsa.report())
        print(table(results, ["case", "impl", "ms", "x vs compile", "check"]), flush=True)
    ok = swapped == 1 and results[2]["check"] == "ok"  # ours; eager and compile are reported only
    if not ok:
        raise SystemExit(f"rank {rank}: swaps {dict(inductor_dsa.lowering.counters)}, checks {results}")


def _worker(rank, world, args, init):
    backend = "gloo" if args.cpu else "nccl"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        run_rank(rank, world, args)
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="CPU ranks over gloo, tiny sizes (a smoke run)")
    ap.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    ap.add_argument("--seqlen", type=int, help="tokens (default: 16384, or 64 with --cpu)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--check-rows", type=int, default=256)
    args = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return
    init = "file://" + os.path.join(tempfile.mkdtemp(), "store")
    mp.spawn(_worker, args=(args.world, args, init), nprocs=args.world)


if __name__ == "__main__":
    main()
