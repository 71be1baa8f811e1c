"""Every kernel once at edge shapes, for a memory checker; prints what ran.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \\
        python benchmarks/sanitize.py

(without the caching allocator every tensor is its own allocation, so a read past one is
reported instead of landing in a neighbour). Shapes are tiny: memcheck runs kernels ~100x
slower. Covers T=1 / K=1, K and topk not multiples of the tiles, topk above the visible
count, context_lens 0 and past capacity, B=1 long contexts split across programs, top-k
above 2048 (sort fallback), sparse attention with M=1, all -1 and out-of-range indices and
split-KV, and unchecked garbage (page ids past the cache or negative, indices >= N) that the
kernels must mask, not read. Without a GPU it runs the same calls under Triton's interpreter.
"""
from __future__ import annotations

import os
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import inductor_dsa as idsa  # noqa: E402
from inductor_dsa import checks, formats  # noqa: E402
from inductor_dsa.kernels import attention_launch  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
G = torch.Generator().manual_seed(0)
PAGE = formats.PAGE_ROWS


def rnd(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=G).to(dtype).to(DEV)


def ints(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEV)


def tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in tensors(o)] if isinstance(out, (tuple, list)) else []


def run(name, fn):
    t0 = time.perf_counter()
    out = fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    shapes = [tuple(t.shape) for t in tensors(out)]
    print(f"ran {name:<72} -> {shapes} ({time.perf_counter() - t0:.2f} s)", flush=True)


def prefill():
    q, k, w = rnd(1, 1, 16), rnd(1, 16), rnd(1, 1, dtype=torch.float32)
    run("indexer_logits T=1 K=1 H=1 D=16", lambda: idsa.indexer_logits(q, k, w))
    run("indexer_topk T=1 K=1 topk=5 (> visible)", lambda: idsa.indexer_topk(q, k, w, 5))
    q, k, w = rnd(3, 5, 64), rnd(67, 64), rnd(3, 5)
    ks, ke = ints(0, 60, 70), ints(67, 2, 200)            # full, inverted, past K
    run("indexer_logits T=3 K=67 H=5 ragged/inverted/past-K ranges",
        lambda: idsa.indexer_logits(q, k, w, k_start=ks, k_end=ke))
    run("indexer_topk K=67 topk=37 (not a tile multiple)",
        lambda: idsa.indexer_topk(q, formats.mxfp4_encode(k.float()), w, 37, k_start=ks, k_end=ke))
    run("indexer_topk fp8 K=67 topk=2049 (sort fallback, > K)",
        lambda: idsa.indexer_topk(q, formats.fp8_encode_rows(k.float(), "fn"), w, 2049))
    run("indexer_topk mxfp4 q+k T=1 K=67 topk=1",
        lambda: idsa.indexer_topk(formats.mxfp4_encode(q[:1].float()), formats.mxfp4_encode(k.float()), w[:1], 1))
    codes, scales = formats.mxfp4_encode(k.float())
    run("indexer_logits mxfp4 k, codes at an odd address (byte loads)",
        lambda: idsa.indexer_logits(q, (odd_copy(codes), scales), w, k_start=ks, k_end=ke))


def odd_copy(x, offset=1, pad=0):
    """x [R, C] copied to byte ``offset`` of a buffer with rows ``pad`` bytes longer (not 4-byte aligned)."""
    buf = torch.empty(x.numel() + x.shape[0] * pad + offset, dtype=x.dtype, device=x.device)
    return buf[offset:].view(x.shape[0], x.shape[1] + pad)[:, :x.shape[1]].copy_(x)


def cache(pages, fmt="mxfp4", d=128):
    x = torch.randn(pages * PAGE, d, generator=G)
    return formats.pack_pages(*formats.encode_rows(x, fmt)).to(DEV)


def paged():
    c = cache(70)
    q, w = rnd(1, 1, 64, 128), rnd(1, 1, 64, dtype=torch.float32)
    bt = torch.arange(64, dtype=torch.int32, device=DEV).view(1, 64)
    run("paged_indexer_topk B=1 L=4096 ctx=4001 topk=512 (split across programs)",
        lambda: idsa.paged_indexer_topk(q, c, w, bt, ints(4001), 512))
    run("paged_indexer_topk B=1 ctx=3 topk=37 (> visible)", lambda: idsa.paged_indexer_topk(q, c, w, bt, ints(3), 37))
    run("paged_indexer_logits B=1 L=4096 ctx=4001", lambda: idsa.paged_indexer_logits(q, c, w, bt, ints(4001)))
    run("paged_indexer_topk cache at an odd address, page stride + 3 B (byte loads)",
        lambda: idsa.paged_indexer_topk(q, odd_copy(c, 1, 3), w, bt, ints(4001), 512))
    q2, w2 = rnd(3, 2, 8, 128), rnd(3, 2, 8, dtype=torch.float32)
    bt2 = torch.arange(9, dtype=torch.int32, device=DEV).view(3, 3)
    zero = ints(0, 0, 0)
    run("paged_indexer_topk B=3 N=2 context_lens all 0", lambda: idsa.paged_indexer_topk(q2, c, w2, bt2, zero, 16))
    run("paged_indexer_logits B=3 N=2 context_lens all 0", lambda: idsa.paged_indexer_logits(q2, c, w2, bt2, zero))
    run("paged_gather context_lens all 0, total_rows=0", lambda: idsa.paged_gather(c, bt2, zero, total_rows=0))
    c8 = cache(9, "fp8")
    run("paged_indexer_topk fp8 B=3 N=2 ctx 1/64/190 topk=2049 (logits + sort fallback)",
        lambda: idsa.paged_indexer_topk(q2, c8, w2, bt2, ints(1, 64, 190), 2049, fmt="fp8"))
    run("paged_gather fp8 ctx 1/64/190 total_rows=100 (truncated)",
        lambda: idsa.paged_gather(c8, bt2, ints(1, 64, 190), fmt="fp8", total_rows=100))
    junk = bt2.clone()
    junk[0, 0], junk[1, 1], junk[2, 2] = 9, -1, 2**31 - 1     # past the cache, negative, huge
    ctx = ints(10**6, 100, -5)                                 # past capacity, in range, negative
    with checks.values(False):
        run("paged_indexer_topk unchecked: bad page ids, context_lens past capacity / negative",
            lambda: idsa.paged_indexer_topk(q2, cache(9), w2, junk, ctx, 40))
        run("paged_indexer_logits unchecked garbage", lambda: idsa.paged_indexer_logits(q2, cache(9), w2, junk, ctx))
        run("paged_gather unchecked garbage, total_rows=500",
            lambda: idsa.paged_gather(cache(9), junk, ctx, total_rows=500))


def sparse():
    q, kv = rnd(1, 1, 16, 64), rnd(1, 50, 64)
    run("sparse_attention M=1 H=16 topk=37 (not a tile multiple)",
        lambda: idsa.sparse_attention(q, kv, torch.randint(0, 50, (1, 1, 37), generator=G).int().to(DEV)))
    run("sparse_attention all -1 indices, sink", lambda: idsa.sparse_attention(
        q, kv, torch.full((1, 1, 37), -1, dtype=torch.int32, device=DEV), sink=rnd(16, dtype=torch.float32)))
    idx = torch.randint(0, 50, (2, 3, 300), generator=G)
    idx[0, 0, ::3] = -1
    q3, kv3 = rnd(2, 3, 5, 64), rnd(2, 50, 64)
    run("sparse_attention split-KV x3 (partials + combine), H=5", lambda: attention_launch.sparse_attention(
        q3, kv3, idx.to(DEV), None, 0.125, splits=3))
    bad = idx.clone().long()
    bad[1, 2, :7] = torch.tensor([50, 51, -2, 2**40, -(2**40), 10**9, 49])
    with checks.values(False):
        run("sparse_attention unchecked int64 indices >= N / < -1", lambda: idsa.sparse_attention(q3, kv3, bad.to(DEV)))


if __name__ == "__main__":
    print(f"device: {torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu (Triton interpreter)'}")
    t0 = time.perf_counter()
    prefill()
    paged()
    sparse()
    print(f"all kernels ran ({time.perf_counter() - t0:.1f} s)")
