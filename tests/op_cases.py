"""One small case per public op (and per launch path), for the tests that run every op the same
way: CUDA-graph capture / replay, sync counting, determinism, the sanitizer script.

A case makes a flat dict of device tensors from a seed (same shapes for every seed, so a graph
captured on one set can replay another after ``copy_``), can empty it in place (context_lens 0,
empty ranges, all -1 indices), calls the public op, and checks the output against the fp64
oracle. GPU sizes are larger (B = 1 long-context split, top-k sort fallback, split-KV attention).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

import inductor_dsa as idsa
from inductor_dsa import formats, reference
from attention_cases import assert_close, make
from indexer_cases import assert_logits, assert_topk, mask_ranges
from paged_cases import assert_paged_topk, make_case, paged_oracle


@dataclass
class Case:
    name: str
    make: Callable[[int], dict]
    empty: Callable[[dict], None]
    call: Callable[[dict], Any]
    check: Callable[[dict, Any], None]


def _cpu(x: dict) -> dict:
    return {k: v.cpu() for k, v in x.items()}


# --- prefill indexer -------------------------------------------------------------------------------

def _indexer(device, t, n, h, d, kind, topk, ranges, mask=False):
    """``mask``: also a random bool [T, K] mask given as data (issue 22)."""
    def mk(seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(t, h, d, generator=g).bfloat16()
        k = torch.randn(n, d, generator=g).bfloat16()
        w = torch.randn(t, h, generator=g)
        ks, ke = mask_ranges(ranges, t, n, g)
        x = dict(q=q, w=w, ks=ks, ke=ke)
        if mask:
            x["m"] = torch.rand(t, n, generator=g) < 0.5
        if kind == "mxfp4":
            x["k"], x["kx"] = formats.mxfp4_encode(k)
        elif kind == "fp8":
            x["k"], x["kx"] = formats.fp8_encode_rows(k, "fn")
        else:
            x["k"] = k
        return {a: b.to(device) for a, b in x.items()}

    def key(x):
        return (x["k"], x["kx"]) if "kx" in x else x["k"]

    def empty(x):
        x["ke"].copy_(x["ks"])

    def ref(x):
        c = _cpu(x)
        return reference.indexer_logits(c["q"], key(c), c["w"], c["ks"], c["ke"], c.get("m"))

    if topk is None:
        return Case(f"indexer_logits[{kind}]", mk, empty,
                    lambda x: idsa.indexer_logits(x["q"], key(x), x["w"], k_start=x["ks"], k_end=x["ke"],
                                                  mask=x.get("m")),
                    lambda x, out: assert_logits(out, ref(x), 1e-5))
    return Case(f"indexer_topk[{kind}, topk={topk}{', mask' if mask else ''}]", mk, empty,
                lambda x: idsa.indexer_topk(x["q"], key(x), x["w"], topk, k_start=x["ks"], k_end=x["ke"],
                                            mask=x.get("m")),
                lambda x, out: assert_topk(*out, ref(x), topk))


# --- paged indexer ---------------------------------------------------------------------------------

def _paged(device, what, fmt, ctx, max_pages, n, h, d, topk=None, total_rows=None):
    def mk(seed):
        q, cache, w, bt, cl = make_case(torch.Generator().manual_seed(seed), fmt=fmt, n=n, h=h, d=d,
                                        max_pages=max_pages, ctx=ctx)
        return {a: b.to(device) for a, b in dict(q=q, cache=cache, w=w, bt=bt, ctx=cl).items()}

    def args(x):
        return x["q"], x["cache"], x["w"], x["bt"], x["ctx"]

    def empty(x):
        x["ctx"].zero_()

    def ref(x):
        return paged_oracle(tuple(_cpu(x)[a] for a in ("q", "cache", "w", "bt", "ctx")), fmt, "fn")

    def check_logits(x, out):
        r = ref(x)
        assert_logits(out.reshape(-1, r.shape[-1]), r.reshape(-1, r.shape[-1]), 1e-5)

    def check_gather(x, out):
        (a, s), ks, ke = out
        c = _cpu(x)
        want = reference.paged_gather(c["cache"], c["bt"], c["ctx"], fmt, d, total_rows)
        s = s.view(torch.uint8).reshape(total_rows, -1) if fmt == "fp8" else s
        for got, exp in zip((a.view(torch.uint8), s, ks, ke), want):
            assert torch.equal(got.cpu(), exp)

    tag = f"{fmt}, B={len(ctx)}, N={n}, H={h}, D={d}, L={max_pages * formats.PAGE_ROWS}"
    if what == "logits":
        return Case(f"paged_indexer_logits[{tag}]", mk, empty,
                    lambda x: idsa.paged_indexer_logits(*args(x), fmt=fmt), check_logits)
    if what == "topk":
        return Case(f"paged_indexer_topk[{tag}, topk={topk}]", mk, empty,
                    lambda x: idsa.paged_indexer_topk(*args(x), topk, fmt=fmt),
                    lambda x, out: assert_paged_topk(*out, ref(x), topk))
    return Case(f"paged_gather[{tag}, rows={total_rows}]", mk, empty,
                lambda x: idsa.paged_gather(x["cache"], x["bt"], x["ctx"], fmt=fmt, total_rows=total_rows),
                check_gather)


# --- sparse attention ------------------------------------------------------------------------------

def _sparse(device, b, m, h, d, n, topk):
    def mk(seed):
        q, kv, idx, s = make(b, m, h, d, n, topk, seed=seed)
        return {a: t.to(device) for a, t in dict(q=q, kv=kv, idx=idx, sink=s).items()}

    def empty(x):
        x["idx"].fill_(-1)

    return Case(f"sparse_attention[B={b}, M={m}, H={h}, D={d}, N={n}, topk={topk}]", mk, empty,
                lambda x: idsa.sparse_attention(x["q"], x["kv"], x["idx"], sink=x["sink"], return_lse=True),
                lambda x, out: assert_close(x["q"], x["kv"], x["idx"], x["sink"], *out))


def cases(device, gpu_sizes: bool | None = None) -> list[Case]:
    """Every public op once (twice where a second launch path exists), sized for ``device``
    (``gpu_sizes`` overrides: the GPU sizes on the interpreter, to check the cases themselves)."""
    if gpu_sizes is None:
        gpu_sizes = torch.device(device).type == "cuda"
    if gpu_sizes:
        return [
            _indexer(device, 37, 75, 8, 64, "bf16", None, "ragged"),
            _indexer(device, 19, 130, 16, 128, "mxfp4", 50, "causal"),
            _indexer(device, 3, 2200, 4, 64, "fp8", 2100, "full"),                # > 2048: sort fallback
            _indexer(device, 37, 300, 8, 64, "bf16", 40, "causal", mask=True),    # mask as data: hull + hide
            _paged(device, "logits", "mxfp4", [0, 1, 65, 190], 3, 2, 8, 64),
            _paged(device, "topk", "mxfp4", [4000], 64, 1, 64, 128, topk=512),   # B=1: sequence split
            _paged(device, "topk", "fp8", [0, 1, 65, 190], 3, 2, 8, 64, topk=24),
            _paged(device, "gather", "mxfp4", [0, 70, 190], 3, 1, 8, 64, total_rows=300),
            _sparse(device, 1, 2, 16, 64, 300, 256),                             # few programs: split-KV
            _sparse(device, 2, 3, 8, 32, 50, 40),
        ]
    return [
        _indexer(device, 5, 13, 2, 32, "bf16", None, "ragged"),
        _indexer(device, 5, 40, 2, 32, "mxfp4", 7, "causal"),
        _indexer(device, 6, 30, 2, 32, "bf16", 5, "ragged", mask=True),
        _paged(device, "logits", "mxfp4", [0, 1, 70], 2, 1, 2, 32),
        _paged(device, "topk", "mxfp4", [190], 3, 1, 4, 32, topk=9),            # interpreter: split plan
        _paged(device, "topk", "fp8", [0, 5, 70], 2, 2, 2, 32, topk=6),
        _paged(device, "gather", "mxfp4", [0, 70, 20], 2, 1, 2, 32, total_rows=100),
        _sparse(device, 1, 2, 3, 16, 20, 9),
    ]


def flat(out) -> list[torch.Tensor]:
    """The tensors of an op's output (nested tuples flattened)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flat(o)]
