"""Decode (paged) DSA indexer: ours vs the eager fallback vs torch.compile of it, one GPU run.

    python benchmarks/bench_paged_indexer.py [--quick] [--smoke] [--no-compile] [--sweep] [--out results.json]

Cases: H=64, D=128, MXFP4 paged cache (68 B per row, 64-row pages, pages shuffled), N query
tokens per request (default 1), context_lens = L minus a few rows (odd lengths).
"ours" calls the public op with check_values=False, as compiled code does (no host sync; Python
and launch overhead included); "ours, CUDA graph" replays it captured in a graph (GPU time
without launch overhead); "+ value checks (sync)" passes check_values=True, the eager API's
default outside benchmarks (common.py turns it off): context_lens / block_table are read back
to the host before launching (checks.paged_values). "eager" is the serving-engine fallback:
gather cache[block_table], dequantise to bf16, bmm, relu, x weights, head sum, mask, topk.
"torch.compile" compiles that same function in this process. Floor = max(bytes / copy
bandwidth, flops / bf16 peak) with bytes = visible cache rows + q + weights + block table +
outputs and flops = 2*N*H*D per visible (token, row) pair. Peak MiB = peak device memory
allocated during one call beyond what was allocated before it (outputs included).
Works with torch >= 2.11 and triton >= 3.6.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CEILINGS, DEVICE, env_line, graphed, peak_extra_bytes, table, time_ms, write_json  # noqa: E402
import inductor_dsa  # noqa: E402
from inductor_dsa import reference  # noqa: E402
from inductor_dsa.kernels import configs, paged_launch  # noqa: E402

H, D = 64, 128
ROW = D // 2 + D // 32  # 68 B
CASES = [  # name, B, L, topk
    ("B=64 L=32768 top-512", 64, 32768, 512),
    ("B=128 L=65536 top-1024", 128, 65536, 1024),
    ("B=8 L=262144 top-1024", 8, 262144, 1024),
    ("B=1 L=262144 top-1024", 1, 262144, 1024),
]
SMOKE = [("B=2 L=256 top-16", 2, 256, 16)]  # --smoke: CPU, Triton interpreter
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def eager_paged_topk(q, kv_cache, weights, block_table, context_lens, topk):
    """The eager fallback as serving code writes it (bf16 compute)."""
    b, n, h, d = q.shape
    pages = kv_cache[block_table.long()]                                  # [B, P, 64*68] gather
    length = block_table.shape[1] * 64
    codes = pages[..., : 64 * d // 2].reshape(b, length, d // 2)
    scales = pages[..., 64 * d // 2:].reshape(b, length, d // 32)
    lut = torch.tensor(E2M1, dtype=torch.bfloat16, device=q.device)
    vals = torch.stack([lut[(codes & 15).int()], lut[(codes >> 4).int()]], dim=-1).reshape(b, length, d)
    scale = torch.exp2(scales.float() - 127.0).to(torch.bfloat16)
    k = (vals.view(b, length, d // 32, 32) * scale.unsqueeze(-1)).view(b, length, d)
    s = torch.bmm(q.reshape(b, n * h, d), k.transpose(1, 2)).view(b, n, h, length)
    logits = (s.relu() * weights.unsqueeze(-1)).sum(2)                    # [B, N, L]
    j = torch.arange(length, device=q.device)
    logits = logits.masked_fill(j >= context_lens.view(b, 1, 1), float("-inf"))
    return logits.topk(topk, dim=-1)


compiled_paged_topk = torch.compile(eager_paged_topk)


def eager_bytes(b, n, length):
    """Rough peak of the eager chain: gathered pages, int codes x2, bf16 values, keys, scores x3."""
    rows = b * length
    return rows * ROW + rows * D * (4 + 2 + 2 + 2) + 3 * b * n * H * length * 2 + b * n * length * 4


def make_case(b, length, n=1, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    pages_per = length // 64
    num_pages = b * pages_per + 8
    cache = torch.randint(0, 256, (num_pages, 64 * ROW), device=DEVICE, generator=g, dtype=torch.uint8)
    scales = cache[:, 64 * D // 2:]
    scales.copy_(torch.randint(122, 131, scales.shape, device=DEVICE, generator=g, dtype=torch.uint8))
    perm = torch.randperm(num_pages, device=DEVICE, generator=g)[: b * pages_per]
    bt = perm.view(b, pages_per).to(torch.int32)
    ctx = (length - torch.arange(b, device=DEVICE) % 7).to(torch.int32)
    q = torch.randn(b, n, H, D, device=DEVICE, generator=g).bfloat16()
    w = (torch.randn(b, n, H, device=DEVICE, generator=g) * D**-0.5 * H**-0.5).bfloat16()
    return q, cache, w, bt, ctx


def floor_ms(b, n, ctx_sum, topk, ceil):
    nbytes = ctx_sum * ROW + b * n * H * (D * 2 + 2) + (ctx_sum // 64 + b) * 4 + b * n * topk * 8
    flops = 2 * n * H * D * ctx_sum
    return max(nbytes / (ceil["copy_tbps"] * 1e12), flops / (ceil["bf16_tflops"] * 1e12)) * 1e3, flops


def check(q, cache, w, bt, ctx, topk, idx, requests=(0,)):
    """Set-with-tolerance check of our top-k on a few requests against the fp64 oracle."""
    sel = torch.tensor(list(requests), device=DEVICE)
    pages = bt[sel].long()  # a compact cache of just these requests' pages keeps the fp64 decode small
    sub_bt = torch.arange(pages.numel(), device=DEVICE, dtype=torch.int32).view(pages.shape)
    ref = reference.paged_indexer_logits(q[sel], cache[pages.reshape(-1)], w[sel], sub_bt, ctx[sel], "mxfp4")
    b, n, length = ref.shape
    return reference.topk_mismatch(idx[sel].reshape(b * n, topk), ref.reshape(b * n, length), topk) or "ok"


def bench_case(name, b, length, topk, n, args, ceil):
    q, cache, w, bt, ctx = make_case(b, length, n)
    ctx_sum = int(ctx.sum())
    floor, flops = floor_ms(b, n, ctx_sum, topk, ceil)
    rows = []

    def row(impl, fn, extra=None, peak=True):
        ms = time_ms(fn)
        peak = peak_extra_bytes(fn) / 2**20 if peak else float("nan")  # a graph's pool is allocated at capture
        r = dict(case=name, impl=impl, ms=ms, tflops=flops / ms / 1e9, floor_ms=floor, x_floor=ms / floor,
                 peak_mib=peak)
        r.update(extra or {})
        rows.append(r)
        print(f"  {impl:28} {ms:9.3f} ms  {r['tflops']:6.1f} TFLOP/s  {ms / floor:6.1f}x floor  "
              f"{peak:9.0f} MiB peak", flush=True)
        return r

    print(f"{name}: floor {floor:.4f} ms (N={n})", flush=True)
    stats = {}
    vals, idx = paged_launch.paged_topk(q, None, cache, w, bt, ctx, topk, "mxfp4", "fn", stats=stats)
    plan = stats["plan"]
    print(f"  plan: {plan.splits} chunk(s) of {plan.chunk} rows per request, {stats['programs']} programs per wave")
    ok = check(q, cache, w, bt, ctx, topk, idx, (0, b - 1) if b > 1 else (0,))
    row("ours: paged top-k", lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk, check_values=False),
        dict(check=ok, splits=plan.splits, chunk=plan.chunk, programs=stats["programs"]))
    if DEVICE == "cuda":
        row("ours: paged top-k, CUDA graph",
            graphed(lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk)), peak=False)
    row("ours: top-k + value checks (sync)",
        lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk, check_values=True), peak=False)
    if not args.quick:
        row("ours: paged logits only",
            lambda: inductor_dsa.paged_indexer_logits(q, cache, w, bt, ctx, check_values=False))
    free = torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else float("inf")
    need = eager_bytes(b, n, length)
    if need > 0.7 * free:
        print(f"  eager / torch.compile skipped: ~{need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free")
        rows.append(dict(case=name, impl="eager", skipped=f"needs ~{need / 2**30:.1f} GiB"))
    else:
        row("eager", lambda: eager_paged_topk(q, cache, w, bt, ctx, topk))
        if not args.no_compile:
            t0 = time.time()
            compiled_paged_topk(q, cache, w, bt, ctx, topk)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            print(f"  (torch.compile warm-up {time.time() - t0:.0f} s)")
            row("torch.compile default", lambda: compiled_paged_topk(q, cache, w, bt, ctx, topk))
    ours = rows[0]["ms"]
    for r in rows:
        if "ms" in r:
            r["speedup_vs_ours"] = r["ms"] / ours
    return rows


def sweep(args, ceil):
    """Time candidate PagedConfigs on three cases, CUDA-graph replay (tuning aid; does not change defaults)."""
    target = configs.target_for(torch.device("cuda"))
    base = configs.PAGED[target]
    cands = [dict(), dict(num_warps=4), dict(progs_per_sm=1), dict(progs_per_sm=4), dict(bn=32),
             dict(chunk_min=2048), dict(chunk_max=16384), dict(num_stages=1), dict(num_stages=3), dict(ch=1024),
             dict(hist_span=32768), dict(hist_span=1 << 30), dict(rank_rows=0), dict(rank_rows=16)]
    out = []
    for name, b, length, topk in [CASES[0], CASES[2], CASES[3]]:
        q, cache, w, bt, ctx = make_case(b, length, args.next_n)
        for c in cands:
            configs.PAGED[target] = dataclasses.replace(base, **c)
            try:
                ms = time_ms(graphed(lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk,
                                                                             check_values=False)), rep=50)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                ms = float("nan")
                print(f"  {c}: {type(e).__name__}: {str(e)[:120]}")
            print(f"  sweep {name} {c or 'default'}: {ms:.3f} ms", flush=True)
            out.append(dict(case=name, config=str(c or "default"), ms=ms))
        configs.PAGED[target] = base
    return out


def graph_check():
    """CUDA-graph capture + replay, with new context_lens (including all zero) written in place."""
    q, cache, w, bt, ctx = make_case(8, 8192, 2, seed=1)
    topk = 512
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vals, idx = inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk)
    results = []
    g = torch.Generator(device="cuda").manual_seed(2)
    for label, new in [("random", torch.randint(0, 8193, (8,), device="cuda", generator=g)),
                       ("all zero", torch.zeros(8, device="cuda")), ("full", torch.full((8,), 8192, device="cuda"))]:
        ctx.copy_(new.to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want_v, want_i = inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk)
        same = torch.equal(idx, want_i) and torch.equal(vals, want_v)
        zero_ok = label != "all zero" or bool((idx == -1).all() and (vals == float("-inf")).all())
        results.append(dict(case=label, replay_equals_eager=same, empty_ok=zero_ok))
        print(f"  graph replay, context_lens {label}: equal to an eager call: {same}; "
              f"{'all -1: ' + str(zero_ok) if label == 'all zero' else ''}", flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="first two cases, no logits-only row")
    ap.add_argument("--smoke", action="store_true", help="one tiny case, no CUDA-graph check (CPU test)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile of the eager chain")
    ap.add_argument("--sweep", action="store_true", help="also time candidate configs")
    ap.add_argument("--next-n", type=int, default=1, help="query tokens per request (MTP), default 1")
    ap.add_argument("--out", help="JSON results file")
    args = ap.parse_args()
    t_start = time.time()
    ceil = dict(CEILINGS)
    print(env_line())
    print(f"H={H} D={D} MXFP4 paged cache, N={args.next_n}; floors from {ceil}")
    rows = []
    for name, b, length, topk in (SMOKE if args.smoke else CASES[:2] if args.quick else CASES):
        rows += bench_case(name, b, length, topk, args.next_n, args, ceil)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    cols = ["case", "impl", "ms", "tflops", "x_floor", "speedup_vs_ours", "peak_mib", "floor_ms", "check", "skipped"]
    print(table(rows, cols))
    graph = []
    if DEVICE == "cuda":
        print("CUDA graph:")
        graph = graph_check()
    sw = sweep(args, ceil) if args.sweep else []
    print(f"total {time.time() - t_start:.0f} s")
    write_json(args.out, dict(env=env_line(), ceilings=ceil, next_n=args.next_n, rows=rows, graph=graph, sweep=sw))


if __name__ == "__main__":
    main()
