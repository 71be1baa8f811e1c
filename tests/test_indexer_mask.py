"""Prefill indexer ops with masks given as data (bool, additive bias) against the float64 oracle."""
import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import reference
from conftest import DEVICE
from indexer_cases import assert_logits, assert_topk, mask_ranges, to_device_each


def _inputs(gen, t, n, h=8, d=64):
    q = torch.randn(t, h, d, generator=gen).bfloat16()
    k = torch.randn(n, d, generator=gen).bfloat16()
    w = torch.randn(t, h, generator=gen).bfloat16()
    return q, k, w


def _mask(kind, t, n, gen):
    """A [T, K] (or broadcast) mask of a kind, CPU."""
    if kind == "random bool":
        return torch.rand(t, n, generator=gen) < 0.5
    if kind == "causal bool":
        return torch.ones(t, n, dtype=torch.bool).tril(n - t)
    if kind == "broadcast bool":
        return (torch.rand(1, n, generator=gen) < 0.7).expand(t, n)
    if kind == "bias":
        return torch.where(torch.rand(t, n, generator=gen) < 0.6, torch.randn(t, n, generator=gen), float("-inf"))
    if kind == "causal bias bf16":
        return _causal_bias(t, n).bfloat16()
    if kind == "causal bool, one hole":  # one row not an interval: its tile must read the mask
        m = torch.ones(t, n, dtype=torch.bool).tril(n - t)
        m[t - 3, (n - 3) // 2] = False
        return m
    if kind == "causal bias, one nonzero":  # one row's visible bias is not 0
        b = _causal_bias(t, n)
        b[5, 0] = 2.5
        return b
    raise AssertionError(kind)


def _causal_bias(t, n):
    return torch.zeros(t, n).masked_fill(~torch.ones(t, n, dtype=torch.bool).tril(n - t), float("-inf"))


KINDS = ["random bool", "causal bool", "broadcast bool", "bias", "causal bias bf16", "causal bool, one hole",
         "causal bias, one nonzero"]


@pytest.mark.parametrize("kind", KINDS)
def test_dense_rows_are_the_wholly_shown_unbiased_hulls(kind, gen):
    """The hull pass flags a row dense (its tile may skip reading the mask) exactly when every column
    of its hull is shown and no shown bias is nonzero."""
    from inductor_dsa.kernels import indexer_launch
    t, n = 37, 75
    m = _mask(kind, t, n, gen)
    ks, ke = mask_ranges("ragged", t, n, gen)
    margs = indexer_launch._mask_args(m.to(DEVICE), ks.to(DEVICE))
    hs, he = indexer_launch._hull(ks.to(DEVICE), ke.to(DEVICE), margs, t, n)
    j = torch.arange(n)
    inside = (j >= ks[:, None].clamp(0, n)) & (j < ke[:, None])
    shown = inside & (m if m.dtype == torch.bool else m != float("-inf"))
    in_hull = (j >= hs.cpu()[:, None]) & (j < he.cpu()[:, None])
    biased = (shown & (m != 0)).any(1) if m.dtype != torch.bool else torch.zeros(t, dtype=torch.bool)
    want = ((shown == in_hull).all(1) & ~biased).int()
    got = margs["row_mask"].cpu()
    assert torch.equal(got.bool() if m.dtype == torch.bool else got == 0, want.bool())
    assert 0 < int(want.sum()) or kind in ("random bool", "bias")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ranges", ["full", "ragged"])
def test_masked_logits_and_topk(kind, ranges, gen):
    t, n, topk = 37, 75, 16
    q, k, w = _inputs(gen, t, n)
    m = _mask(kind, t, n, gen)
    ks, ke = mask_ranges(ranges, t, n, gen)
    dev = to_device_each(q, k, w)
    md, ksd, ked = m.to(DEVICE), ks.to(DEVICE), ke.to(DEVICE)
    ref = reference.indexer_logits(q, k, w, ks, ke, m)
    assert_logits(idsa.indexer_logits(*dev, k_start=ksd, k_end=ked, mask=md), ref, 1e-5)
    vals, idx = idsa.indexer_topk(*dev, topk, k_start=ksd, k_end=ked, mask=md)
    assert_topk(vals, idx, ref, topk)


def test_broadcast_mask_is_not_copied(gen, monkeypatch):
    from inductor_dsa.kernels import indexer_launch
    seen = []
    real = indexer_launch._mask_args
    monkeypatch.setattr(indexer_launch, "_mask_args", lambda m, ks: seen.append(m.stride()) or real(m, ks))
    q, k, w = _inputs(gen, 9, 20)
    m = (torch.rand(20, generator=gen) < 0.5).to(DEVICE)
    idsa.indexer_logits(*to_device_each(q, k, w), mask=m)
    assert seen and seen[0][0] == 0  # the expanded view reached the kernel


def test_all_masked_rows_and_fewer_than_k(gen):
    t, n, topk = 12, 30, 20
    q, k, w = _inputs(gen, t, n)
    m = torch.rand(t, n, generator=gen) < 0.3
    m[3] = False
    vals, idx = idsa.indexer_topk(*to_device_each(q, k, w), topk, mask=m.to(DEVICE))
    rv, ri = reference.indexer_topk(q, k, w, topk, mask=m)
    assert torch.equal(idx.cpu(), ri) and (idx[3] == -1).all()
    assert torch.equal(vals.cpu().isneginf(), rv.isneginf())


@pytest.mark.parametrize("bad,exc,what", [
    (torch.ones(5, 7, dtype=torch.int32), TypeError, "bool"),
    (torch.ones(4, 7, dtype=torch.bool), ValueError, "broadcasts"),
    (torch.ones(2, 5, 7, dtype=torch.bool), ValueError, "broadcasts"),
    (torch.full((5, 7), float("nan")), ValueError, "NaN"),
    (torch.full((5, 7), float("inf")), ValueError, "inf"),
])
def test_bad_masks_raise(bad, exc, what, gen):
    q, k, w = _inputs(gen, 5, 7)
    with pytest.raises(exc, match=what):
        idsa.indexer_topk(*to_device_each(q, k, w), 4, mask=bad.to(DEVICE))


def test_masked_topk_traces_under_compile(gen):
    q, k, w = _inputs(gen, 9, 20, 4, 32)
    m = torch.rand(9, 20, generator=gen) < 0.5
    f = torch.compile(lambda q, k, w, m: idsa.indexer_topk(q, k, w, 5, mask=m), fullgraph=True)
    vals, idx = f(*to_device_each(q, k, w, m))
    assert torch.equal(idx.cpu(), reference.indexer_topk(q, k, w, 5, mask=m)[1])
