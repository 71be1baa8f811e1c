"""Benchmark inductor_dsa.sparse_attention against eager torch and torch.compile of the same eager code.

    python benchmarks/bench_sparse_attention.py --out sparse_attention.json
        [--cases prefill,decode] [--no-compile] [--smoke] [--bh 64 --bn 64 --num-warps 8 --num-stages 2 --gather 0]

Cases (bf16, D = 512, one KV head, sink on; indices = 128 window slots + top-k compressed slots):
  prefill  B=1, M=4096, H=64, topk 512+128; kv = 4096 raw rows + 1024 compressed (ratio 4),
           query t sees window rows t-127..t and top-k among compressed rows j < (t+1)//4
           (-1 where fewer exist: early queries have holes)
  decode   B=64, M in {1, 2}, H in {64, 128}, topk 1024+128; kv = 128 window + 8192 compressed rows
  --smoke  one tiny prefill (M=16, H=2, top-4), no torch.compile: the CPU test of benchmarks/run.py

Times are triton.testing.do_bench medians (ms) on the current GPU: of a plain call (Python and
launch overhead included: decode calls are host-bound on a slow host) and, for ours and
torch.compile, of the call captured in a CUDA graph and replayed (GPU time). TFLOP/s counts
2*2*H*D flops per valid slot (QK^T and PV). Peak memory is the allocator's peak during one
call minus what was allocated before it (inputs excluded). err = max |out - fp64 oracle|
on a subset of queries. Our op is called with check_indices=False (no host sync).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEVICE, env_line, graphed, peak_extra_bytes, time_ms  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

import inductor_dsa  # noqa: E402
from inductor_dsa import reference  # noqa: E402
from inductor_dsa.kernels import attention_launch, configs  # noqa: E402

WINDOW = 128
D = 512


def eager_sparse_attention(q, kv, idx, sink, scale: float):
    """Oracle-style torch: gather kv[idx], einsum, masked softmax with a sink column, einsum."""
    b, m, h, d = q.shape
    valid = idx >= 0
    bi = torch.arange(b, device=q.device).view(b, 1, 1)
    rows = kv[bi, idx.clamp_min(0).long()]                                   # [B, M, K, D]
    s = torch.einsum("bmhd,bmkd->bmhk", q, rows).float() * scale
    s = s.masked_fill(~valid.unsqueeze(2), float("-inf"))
    s = torch.cat([s, sink.view(1, 1, h, 1).expand(b, m, h, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :-1]
    return torch.einsum("bmhk,bmkd->bmhd", p.to(q.dtype), rows)


def _topk_rows(n_visible: torch.Tensor, n_pool: int, k: int, g: torch.Generator, device):
    """[R, k] distinct random rows below n_visible[r] (first min(k, n_visible) slots), -1 elsewhere."""
    keys = torch.rand(n_visible.numel(), n_pool, generator=g, device=device)
    keys = keys.masked_fill(torch.arange(n_pool, device=device) >= n_visible.unsqueeze(1), -1.0)
    val, sel = keys.topk(min(k, n_pool), dim=-1)
    sel = torch.where(val >= 0, sel, -1)
    if k > n_pool:
        sel = torch.nn.functional.pad(sel, (0, k - n_pool), value=-1)
    return sel


def prefill_inputs(m: int, h: int, topk: int, device, g):
    n_cmp = m // 4
    q = torch.randn(1, m, h, D, generator=g, device=device).bfloat16()
    kv = torch.randn(1, m + n_cmp, D, generator=g, device=device).bfloat16()
    t = torch.arange(m, device=device)
    win = t.unsqueeze(1) - WINDOW + 1 + torch.arange(WINDOW, device=device)
    win = torch.where(win >= 0, win, -1)
    cmp = _topk_rows((t + 1) // 4, n_cmp, topk, g, device)
    cmp = torch.where(cmp >= 0, cmp + m, -1)
    idx = torch.cat([win, cmp], dim=1).unsqueeze(0).to(torch.int32).contiguous()
    return q, kv, idx


def decode_inputs(b: int, m: int, h: int, topk: int, n_cmp: int, device, g):
    q = torch.randn(b, m, h, D, generator=g, device=device).bfloat16()
    kv = torch.randn(b, WINDOW + n_cmp, D, generator=g, device=device).bfloat16()
    win = torch.arange(WINDOW, device=device).expand(b, m, WINDOW)
    cmp = _topk_rows(torch.full((b * m,), n_cmp, device=device), n_cmp, topk, g, device)
    idx = torch.cat([win, cmp.view(b, m, topk) + WINDOW], dim=2).to(torch.int32).contiguous()
    return q, kv, idx


def oracle_error(out, q, kv, idx, sink, scale, rows) -> float:
    sub = lambda x: x[:, rows]
    ref, _ = reference.sparse_attention(sub(q), kv, sub(idx), sink, scale)
    return (sub(out).double() - ref).abs().max().item()


def run_case(name, q, kv, idx, sink, compiled, results):
    scale = D ** -0.5
    h = q.shape[2]
    flops = 4.0 * h * D * (idx >= 0).sum().item()
    m = q.shape[1]
    rows = sorted({0, 1, m // 2, m - 1, *range(0, m, max(1, m // 16))} & set(range(m)))  # M may be 1
    impls = {
        "inductor_dsa": lambda: inductor_dsa.sparse_attention(q, kv, idx, sink=sink, scale=scale, check_indices=False),
        "eager": lambda: eager_sparse_attention(q, kv, idx, sink, scale),
    }
    if compiled is not None:
        impls["torch.compile"] = lambda: compiled(q, kv, idx, sink, scale)
    for impl, fn in impls.items():
        t0 = time.perf_counter()
        out = fn()  # first call (compiles)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        err = oracle_error(out, q, kv, idx, sink, scale, rows)
        del out
        ms = time_ms(fn)
        graph_ms = time_ms(graphed(fn)) if DEVICE == "cuda" and impl != "eager" else float("nan")
        peak = peak_extra_bytes(fn) / 2**30
        row = dict(case=name, impl=impl, B=q.shape[0], M=m, H=h, D=D, topk=idx.shape[2], N=kv.shape[1],
                   valid_slots=int(flops / (4 * h * D)), ms=ms, graph_ms=graph_ms, tflops=flops / ms / 1e9,
                   peak_gib=peak, max_err_vs_fp64=err, first_call_s=first_s)
        results.append(row)
        print(f"{name:<22} {impl:<14} {ms:9.4f} ms (graph replay {graph_ms:7.4f}) {row['tflops']:8.1f} TFLOP/s "
              f"{peak:8.3f} GiB err {err:.3g}  (first call {first_s:.1f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--cases", default="prefill,decode")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--smoke", action="store_true", help="one tiny prefill, no torch.compile (CPU test)")
    ap.add_argument("--bh", type=int)
    ap.add_argument("--bn", type=int)
    ap.add_argument("--num-warps", type=int)
    ap.add_argument("--num-stages", type=int)
    ap.add_argument("--gather", type=int, choices=(0, 1))
    ap.add_argument("--max-splits", type=int)
    a = ap.parse_args()
    dev = torch.device(DEVICE)
    target = configs.target_for(dev)
    over = {k: getattr(a, k) for k in ("bh", "bn", "num_warps", "num_stages", "gather", "max_splits")
            if getattr(a, k) is not None}
    cfg = dataclasses.replace(configs.SPARSE_ATTENTION[target], **over)
    configs.SPARSE_ATTENTION[target] = cfg
    print(f"{env_line()}  target {target}  {cfg}", flush=True)
    compiled = None if a.no_compile or a.smoke else torch.compile(eager_sparse_attention, dynamic=False)
    g = torch.Generator(device=dev).manual_seed(0)
    results = []
    cases = a.cases.split(",")
    if a.smoke:
        cases = []
        q, kv, idx = prefill_inputs(16, 2, 4, dev, g)
        run_case("smoke prefill M16 H2", q, kv, idx, torch.rand(2, generator=g, device=dev) + 1, None, results)
    if "prefill" in cases:
        q, kv, idx = prefill_inputs(4096, 64, 512, dev, g)
        sink = torch.rand(64, generator=g, device=dev) * 4 + 1
        run_case("prefill M4096 H64", q, kv, idx, sink, compiled, results)
        del q, kv, idx
    if "decode" in cases:
        for h in (64, 128):
            for m in (1, 2):
                q, kv, idx = decode_inputs(64, m, h, 1024, 8192, dev, g)
                sink = torch.rand(h, generator=g, device=dev) * 4 + 1
                blocks = 64 * m * triton.cdiv(h, attention_launch.sparse_attention_heads(cfg, h))
                splits = attention_launch.sparse_attention_splits(dev, cfg, blocks, 1152)
                run_case(f"decode B64 M{m} H{h} s{splits}", q, kv, idx, sink, compiled, results)
                del q, kv, idx
    meta = dict(device=env_line().split(",")[0], torch=torch.__version__, triton=triton.__version__,
                target=target, config={k: v for k, v in dataclasses.asdict(cfg).items()},
                note="do_bench median; TFLOP/s = 4*H*D*valid_slots / time")
    Path(a.out).write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
