"""The graph pass on a V4-style Indexer module: inductor_dsa.backend vs default torch.compile vs eager.

    python benchmarks/bench_pass.py [--quick] [--smoke] [--out results.json]

Module: the CSA `Indexer` of examples/deepseek_v4_attention.py (written in the style of the
official reference: q and head weights from linears, weights * D**-0.5 * H**-0.5, compressed keys
written to a kv_cache buffer, einsum "bshd,btd->bsht", relu_, weighted head sum, ratio mask
j >= (t+1)//4 -> -inf, topk, -1 post-processing; its `decode` reads a paged MXFP4 cache through
cache[block_table], a 16-entry E2M1 table and E8M0 scales, masks j >= context_lens, topk).
H = 64 index heads, D = 128, top-512 (V4-Flash), model dim 2048, bf16.

Cases: prefill S=8192 and S=16384 (K = S/4 compressed keys), decode B=64 with L=32768
compressed rows per request (MXFP4 paged cache, pages shuffled; bench_paged_indexer's cache).
For each compiler: the first call's wall time (the compilation, Inductor caches disabled) and
the swaps our pass made (inductor_dsa's own counters: whatever it matched, reported as is).
Compile overhead = first call with inductor_dsa.backend / first call with default Inductor - 1;
"pass s" is the time spent inside our graph pass, "JIT s" Triton compiling the kernels our ops
launch (once per machine: Triton's disk cache keeps them), and the overhead less JIT is
(first call - JIT s) with ours over the same for default - 1. Times: median ms (common.time_ms);
on a GPU also "graph ms", the call captured in a CUDA graph and replayed (GPU time without the
host's launch cost, which bounds the decode call on a slow host; x_vs_compile_graph compares
those).
Floor = max(flops / bf16 peak, bytes / copy bandwidth), flops = the module's linears +
2*H*D per visible (query, key) pair, bytes = weights + inputs + cache rows read + outputs.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "examples")]

from common import CEILINGS, DEVICE, env_line, graphed, peak_extra_bytes, table, time_ms, write_json  # noqa: E402

import torch  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import inductor_dsa  # noqa: E402
from inductor_dsa import lowering, reference  # noqa: E402
import bench_paged_indexer as paged  # noqa: E402
from deepseek_v4_attention import Indexer  # noqa: E402

H, D, RATIO = 64, 128, 4
SIZES = {  # dim, prefill lengths, decode (B, L), top-k
    "full": (2048, (8192, 16384), (64, 32768), 512),
    "smoke": (64, (32,), (2, 128), 4),
}


@contextlib.contextmanager
def method_timer(cls, name):
    """Accumulates the seconds spent inside ``cls.name`` (every call, any instance); NaN if the
    class has no such method (a Triton version without ``JITFunction._do_compile``)."""
    if not hasattr(cls, name):
        yield [float("nan")]
        return
    inner, spent = getattr(cls, name), [0.0]

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
    setattr(cls, name, timed)
    try:
        yield spent
    finally:
        setattr(cls, name, inner)


def bf16_floor_ms(flops, nbytes):
    return max(flops / (CEILINGS["bf16_tflops"] * 1e9), nbytes / (CEILINGS["copy_tbps"] * 1e9))


def linear_cost(m: Indexer, rows, proj_rows):
    """(flops, weight bytes) of the query/weight projections on `rows` and the compressor on `proj_rows`."""
    dim = m.wq.in_features
    flops = 2 * rows * dim * (m.wq.out_features + m.weights_proj.out_features)
    flops += 2 * proj_rows * dim * 2 * m.head_dim  # compressor: wkv and wgate
    return flops, sum(p.numel() * p.element_size() for p in m.parameters())


def prefill_case(m: Indexer, dim, seqlen, dtype):
    x = torch.randn(1, seqlen, dim, device=DEVICE, dtype=dtype)
    ks, ke = reference.ratio_ranges(seqlen, RATIO, DEVICE)
    pairs = int((ke - ks).clamp(min=0).sum())
    flops, wbytes = linear_cost(m, seqlen, seqlen)
    k = min(m.index_topk, seqlen // RATIO)
    floor = bf16_floor_ms(flops + 2 * H * D * pairs, wbytes + x.numel() * x.element_size() + seqlen * k * 8)

    def check(idx):
        q, kk, w = m.inputs(x)
        sel = torch.linspace(0, seqlen - 1, min(seqlen, 256), device=DEVICE).long()
        logits = reference.indexer_logits(q[0, sel], kk[0], w[0, sel], ks[sel], ke[sel])
        return reference.topk_mismatch(idx[0, sel], logits, k) or "ok"
    return m.forward, (x,), floor, check


def decode_case(m: Indexer, dim, b, length, dtype):
    _, cache, _, bt, ctx = paged.make_case(b, length)
    x = torch.randn(b, 1, dim, device=DEVICE, dtype=dtype)
    ctx_sum = int(ctx.sum())
    flops, wbytes = linear_cost(m, b, 0)
    flops += 2 * H * D * ctx_sum
    nbytes = wbytes + ctx_sum * paged.ROW + bt.numel() * 4 + b * m.index_topk * 8
    floor = bf16_floor_ms(flops, nbytes)

    def check(idx):
        q, w = m.query(x)
        return paged.check(q, cache, w, bt, ctx, m.index_topk, idx, (0, b - 1))
    return m.decode, (x, cache, bt, ctx), floor, check


def first_call(fn, args, backend):
    """Compile fn fresh with `backend`, run it once; (compiled fn, output, wall s, pass s, JIT s, swaps)."""
    torch._dynamo.reset()
    lowering.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    # JIT: Triton compiling the kernels launched by their own launchers (ours); Inductor's
    # generated kernels are compiled by its own workers and not counted here.
    with (method_timer(lowering.IndexerPass, "__call__") as spent,
          method_timer(JITFunction, "_do_compile") as jit):
        t0 = time.perf_counter()
        out = compiled(*args)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return compiled, out, wall, spent[0], jit[0], dict(lowering.counters)


def graph_ms(call, args) -> float:
    """Median ms of call(*args) captured in a CUDA graph and replayed; NaN on a CPU or if the
    capture fails (the reason is printed)."""
    if DEVICE != "cuda":
        return float("nan")
    try:
        return time_ms(graphed(lambda: call(*args)))
    except RuntimeError as e:
        print(f"  (no CUDA-graph timing: {str(e).splitlines()[0]})", flush=True)
        return float("nan")


def bench(name, fn, args, floor, check, backends, rows):
    print(f"{name}: floor {floor:.4f} ms", flush=True)
    compiled = {}
    for impl, backend in backends.items():
        compiled[impl], out, wall, spent, jit, swaps = first_call(fn, args, backend)
        rows.append(dict(case=name, impl=impl, compile_s=wall, pass_s=spent, jit_s=jit, swaps=swaps,
                         check=check(out)))
        print(f"  {impl}: first call {wall:.1f} s (pass {spent:.2f} s, Triton JIT {jit:.2f} s), "
              f"swaps {swaps or 'none'}, "
              f"top-k vs fp64 oracle: {rows[-1]['check']}", flush=True)
    ours, default = rows[-1], rows[-2]
    ours["compile_overhead"] = ours["compile_s"] / default["compile_s"] - 1
    ours["overhead_warm_jit"] = (ours["compile_s"] - ours["jit_s"]) / (default["compile_s"] - default["jit_s"]) - 1
    rows.append(dict(case=name, impl="eager"))
    runners = {"eager": fn, **compiled}
    for r in rows[-3:]:
        call = runners[r["impl"]]
        r.update(ms=time_ms(lambda: call(*args)), floor_ms=floor,
                 peak_mib=peak_extra_bytes(lambda: call(*args)) / 2**20, graph_ms=graph_ms(call, args))
        r["x_floor"] = r["ms"] / floor
        print(f"  {r['impl']:28} {r['ms']:9.3f} ms (graph replay {r['graph_ms']:7.3f})  {r['x_floor']:7.1f}x floor  "
              f"{r['peak_mib']:9.0f} MiB peak", flush=True)
    for key, col in (("ms", "x_vs_compile"), ("graph_ms", "x_vs_compile_graph")):
        ms = {r["impl"]: r[key] for r in rows[-3:]}
        for r in rows[-3:]:
            r[col] = ms["torch.compile default"] / r[key]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="prefill S=8192 and decode only")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, Inductor without code generation (the CPU test of benchmarks/run.py)")
    ap.add_argument("--out", help="JSON results file")
    args = ap.parse_args()
    # cold compiles: this benchmark measures compile time (compile_s, compile_overhead), which a cache hit skips
    torch._inductor.config.force_disable_caches = True
    dim, seqs, (b, length), topk = SIZES["smoke" if args.smoke else "full"]
    if args.quick:
        seqs = seqs[:1]
    # bf16 as on the GPU: the paged decode kernels take bf16 q (fp32 q: the decode is not swapped)
    dtype = torch.bfloat16 if DEVICE == "cuda" or args.smoke else torch.float32
    print(env_line(), flush=True)
    print(f"Indexer H={H} D={D} ratio {RATIO} top-{topk}, dim {dim}, {dtype}", flush=True)
    torch.manual_seed(0)
    m = Indexer(dim, H, D, RATIO, topk, max_len=max(seqs), max_batch=1).to(DEVICE, dtype).eval()
    backends = {"torch.compile default": "inductor", "ours: inductor_dsa.backend": inductor_dsa.backend}
    if args.smoke:  # graph passes without code generation: seconds instead of minutes on a CPU
        backends = {"torch.compile default": lowering.graph_only_backend(None),
                    "ours: inductor_dsa.backend": lowering.graph_only_backend()}
    rows = []
    with torch.no_grad():
        if not args.smoke:  # one small compile per backend first, so one-time process costs
            warm = prefill_case(m, dim, 1024, dtype)  # (imports, Triton JIT of our kernels) do not
            for backend in backends.values():  # land in the first measured compilation
                first_call(warm[0], warm[1], backend)
        for s in seqs:
            fn, a, floor, check = prefill_case(m, dim, s, dtype)
            bench(f"prefill S={s} K={s // RATIO} top-{topk}", fn, a, floor, check, backends, rows)
            del fn, a
        fn, a, floor, check = decode_case(m, dim, b, length, dtype)
        bench(f"decode B={b} L={length} mxfp4 paged top-{topk}", fn, a, floor, check, backends, rows)
    cols = ["case", "impl", "ms", "x_vs_compile", "graph_ms", "x_vs_compile_graph", "floor_ms", "x_floor",
            "peak_mib", "compile_s", "pass_s",
            "jit_s", "compile_overhead", "overhead_warm_jit", "swaps", "check"]
    print(table(rows, cols))
    for key, what in (("compile_overhead", "first call, caches off"),
                      ("overhead_warm_jit", "first call less Triton JIT time: our kernels in Triton's disk cache")):
        over = [f"{r[key]:+.1%}" for r in rows if key in r]
        print(f"compile overhead of inductor_dsa.backend ({what}): {', '.join(over)} (target < +10%)")
    write_json(args.out, dict(env=env_line(), ceilings=CEILINGS, rows=rows))


if __name__ == "__main__":
    main()
