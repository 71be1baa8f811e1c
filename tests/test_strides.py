"""Every tensor argument of every public op, as a non-contiguous view (strided, column-major,
padded rows, misaligned storage offset), gives exactly the contiguous call's result: every
pointer a kernel reads honours the strides, or the op makes the tensor contiguous first.

``kv_cache`` pages must be contiguous (stride(1) == 1, a documented ValueError), so it only gets
the padded-row and offset views. A hypothesis test draws shapes and a layout per argument.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import inductor_dsa as idsa
from inductor_dsa import formats
from inductor_dsa.kernels import configs
from conftest import DEVICE
from paged_cases import make_case
from property_settings import examples


def strided(x):
    """Every other element of a buffer twice as long in the last dim (``meta[:, 0]`` for a [B])."""
    return torch.stack([x, torch.zeros_like(x)], -1)[..., 0]


def transposed(x):
    """Column-major: the same values, dims laid out in reverse order."""
    rev = list(range(x.dim()))[::-1]
    return x.permute(rev).contiguous().permute(rev)


def padded(x):
    """Rows 3 elements longer than the last dim (stride(-2) > size(-1))."""
    buf = torch.zeros(*x.shape[:-1], x.shape[-1] + 3, dtype=x.dtype, device=x.device)
    return buf[..., :x.shape[-1]].copy_(x)


def offset(x):
    """Contiguous strides at storage offset 1 (an address that need not be 4- or 16-byte aligned)."""
    buf = torch.zeros(x.numel() + 1, dtype=x.dtype, device=x.device)
    return buf[1:].view(x.shape).copy_(x)


LAYOUTS = {"strided": strided, "transposed": transposed, "padded": padded, "offset": offset}
PAGE_LAYOUTS = ("padded", "offset")  # kv_cache: pages stay contiguous


def layouts(name, x):
    names = PAGE_LAYOUTS if name == "cache" else LAYOUTS
    return [n for n in names if x.dim() >= 2 or n in ("strided", "offset")]


# --- one case per op and launch path: (make(gen, **sizes) -> dict of CPU tensors, call(dict)) ------

def _indexer(kind):
    def make(g, t=5, n=37, h=3):
        d = 32
        q = torch.randn(t, h, d, generator=g).bfloat16()
        k = torch.randn(n, d, generator=g).bfloat16()
        x = dict(q=q, k=k, w=torch.randn(t, h, generator=g),
                 ks=torch.randint(-2, n // 2, (t,), generator=g, dtype=torch.int32),
                 ke=torch.randint(n // 2, n + 3, (t,), generator=g, dtype=torch.int32))
        if kind == "mxfp4":
            (x["q"], x["qx"]), (x["k"], x["kx"]) = formats.mxfp4_encode(q), formats.mxfp4_encode(k)
        elif kind == "fp8":
            x["k"], x["kx"] = formats.fp8_encode_rows(k, "fn")
        return x
    return make


def _pair(x, a):
    return (x[a], x[a + "x"]) if a + "x" in x else x[a]


def _idx_args(x):
    return _pair(x, "q"), _pair(x, "k"), x["w"]


def _paged(q_mxfp4, fmt="mxfp4"):
    def make(g, b=3, n=2, h=3):
        ctx = [0, 70, 130, 5, 191][:b]
        q, cache, w, bt, cl = make_case(g, fmt=fmt, n=n, h=h, d=32, ctx=ctx, q_mxfp4=q_mxfp4)
        x = dict(cache=cache, w=w, bt=bt, ctx=cl)
        if q_mxfp4:
            x["q"], x["qx"] = q
        else:
            x["q"] = q
        return x
    return make


def _paged_args(x):
    return _pair(x, "q"), x["cache"], x["w"], x["bt"], x["ctx"]


def _sparse(g, b=2, m=2, h=3):
    d, n, topk = 16, 20, 9
    idx = torch.randint(0, n, (b, m, topk), generator=g, dtype=torch.int32)
    idx[torch.rand(b, m, topk, generator=g) < 0.2] = -1
    return dict(q=torch.randn(b, m, h, d, generator=g).bfloat16(), kv=torch.randn(b, n, d, generator=g).bfloat16(),
                idx=idx, sink=torch.rand(h, generator=g) * 3)


OPS = {
    "indexer_logits[bf16]": (_indexer("bf16"), lambda x: idsa.indexer_logits(*_idx_args(x), k_start=x["ks"], k_end=x["ke"])),
    "indexer_logits[mxfp4]": (_indexer("mxfp4"), lambda x: idsa.indexer_logits(*_idx_args(x), k_start=x["ks"], k_end=x["ke"])),
    "indexer_topk[fp8 k]": (_indexer("fp8"), lambda x: idsa.indexer_topk(*_idx_args(x), 7, k_start=x["ks"], k_end=x["ke"])),
    "indexer_topk[mxfp4]": (_indexer("mxfp4"), lambda x: idsa.indexer_topk(*_idx_args(x), 7, k_start=x["ks"], k_end=x["ke"])),
    "indexer_topk[bf16, topk>2048]": (_indexer("bf16"), lambda x: idsa.indexer_topk(*_idx_args(x), 2049, k_start=x["ks"], k_end=x["ke"])),
    "logits_topk": (lambda g, t=5, n=37: dict(logits=torch.randn(t, n, generator=g),
                                              ks=torch.randint(-2, n // 2, (t,), generator=g, dtype=torch.int32),
                                              ke=torch.randint(n // 2, n + 3, (t,), generator=g, dtype=torch.int32)),
                    lambda x: idsa.logits_topk(x["logits"], 6, k_start=x["ks"], k_end=x["ke"])),
    "paged_indexer_logits[bf16 q]": (_paged(False), lambda x: idsa.paged_indexer_logits(*_paged_args(x))),
    "paged_indexer_topk[mxfp4 q]": (_paged(True), lambda x: idsa.paged_indexer_topk(*_paged_args(x), 9)),
    "paged_indexer_topk[fp8 cache]": (_paged(False, "fp8"), lambda x: idsa.paged_indexer_topk(*_paged_args(x), 9, fmt="fp8")),
    "paged_gather": (_paged(False), lambda x: idsa.paged_gather(x["cache"], x["bt"], x["ctx"], total_rows=250)),
    "sparse_attention": (_sparse, lambda x: idsa.sparse_attention(x["q"], x["kv"], x["idx"], sink=x["sink"],
                                                                  return_lse=True)),
}
CALLS_ONLY = {"q", "qx", "k", "kx", "w", "ks", "ke", "logits", "cache", "bt", "ctx", "kv", "idx", "sink"}


def _flat(out):
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _flat(o)]


def _assert_same(got, want, what):
    for a, b in zip(_flat(got), _flat(want), strict=True):
        a = a.view(torch.uint8) if a.dtype in formats.FP8_DTYPES.values() else a
        b = b.view(torch.uint8) if b.dtype in formats.FP8_DTYPES.values() else b
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True, msg=what)


def _run(call, x):
    return call({k: v.to(DEVICE) for k, v in x.items()})


@pytest.mark.parametrize("path", ["kernels", "fallback"])
@pytest.mark.parametrize("op", list(OPS))
def test_every_argument_noncontiguous(op, path, monkeypatch):
    if path == "fallback":  # what a CPU without the interpreter runs
        monkeypatch.setattr(configs, "use_kernels", lambda device: False)
    make, call = OPS[op]
    x = make(torch.Generator().manual_seed(0))
    assert set(x) <= CALLS_ONLY
    want = _run(call, x)
    for name, t in x.items():
        for lay in layouts(name, t):
            y = dict(x)
            y[name] = LAYOUTS[lay](t)
            assert torch.equal(y[name], t)
            if lay != "offset" and min(t.shape) > 1:
                assert not y[name].is_contiguous(), (name, lay)
            _assert_same(_run(call, y), want, f"{op}: {name} {lay}")


@pytest.mark.parametrize("op", list(OPS))
@examples(3)
@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_noncontiguous_property(op, seed, data):
    """Random small shapes, a random layout for every argument at once, against the contiguous call."""
    make, call = OPS[op]
    sizes = {"b": data.draw(st.integers(1, 3))} if op.startswith(("paged", "sparse")) else {}
    sizes["h"] = data.draw(st.sampled_from([1, 2, 3, 5])) if op != "logits_topk" else None
    if op == "logits_topk":
        sizes = dict(t=data.draw(st.integers(1, 6)), n=data.draw(st.integers(2, 40)))
    x = make(torch.Generator().manual_seed(seed), **sizes)
    want = _run(call, x)
    y = {k: (LAYOUTS[lay](v) if (lay := data.draw(st.sampled_from([None] + layouts(k, v)), label=k)) else v)
         for k, v in x.items()}
    _assert_same(_run(call, y), want, op)
