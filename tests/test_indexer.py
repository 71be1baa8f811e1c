"""Prefill indexer ops (logits, fused top-k) against the float64 oracle."""
import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import formats, reference
from conftest import DEVICE, misaligned_copy
from indexer_cases import assert_logits, assert_topk, logits_tol, mask_ranges, quantised, to_device_each


def _inputs(gen, t, n, h, d, dtype=torch.bfloat16):
    q = torch.randn(t, h, d, generator=gen).to(dtype)
    k = torch.randn(n, d, generator=gen).to(dtype)
    w = torch.randn(t, h, generator=gen).to(dtype)  # signed, like weights_proj output
    return q, k, w


SHAPES = [  # T, K, H, D
    (1, 1, 1, 64), (37, 75, 8, 64), (19, 130, 64, 128), (70, 33, 1, 16), (5, 3, 3, 128),
]


@pytest.mark.parametrize("t,n,h,d", SHAPES)
@pytest.mark.parametrize("mask", ["full", "causal", "ragged"])
def test_logits_bf16(t, n, h, d, mask, gen):
    q, k, w = _inputs(gen, t, n, h, d)
    ks, ke = mask_ranges(mask, t, n, gen)
    out = idsa.indexer_logits(*to_device_each(q, k, w), k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    assert out.dtype == torch.float32 and out.shape == (t, n)
    assert_logits(out, reference.indexer_logits(q, k, w, ks, ke), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_logits_fp16_fp32(dtype, gen):
    q, k, w = _inputs(gen, 23, 41, 8, 64, dtype)
    out = idsa.indexer_logits(*to_device_each(q, k, w))
    assert_logits(out, reference.indexer_logits(q, k, w), 1e-5)


@pytest.mark.parametrize("kind", ["mxfp4 k", "mxfp4 q+k", "fp8 k fn", "fp8 q+k fn", "fp8 q+k fnuz", "fp8 k fnuz"])
def test_logits_quantised(kind, gen):
    q, k, w = _inputs(gen, 29, 67, 8, 128)
    qq, kk = quantised(kind, q, k, gen)
    ks, ke = reference.causal_ranges(29, 67)
    out = idsa.indexer_logits(*to_device_each(qq, kk, w), k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    assert_logits(out, reference.indexer_logits(qq, kk, w, ks, ke), logits_tol(kind))


def test_logits_misaligned_mxfp4_keys(gen):
    # MXFP4 codes are read as 32-bit words; codes at an odd address take the byte-load path
    q, k, w = _inputs(gen, 13, 45, 8, 64)
    codes, scales = to_device_each(*formats.mxfp4_encode(k))
    odd = misaligned_copy(codes)
    assert odd.data_ptr() % 4
    qd, wd = to_device_each(q, w)
    assert torch.equal(idsa.indexer_logits(qd, (odd, scales), wd), idsa.indexer_logits(qd, (codes, scales), wd))


@pytest.mark.parametrize("t,n,h,d,topk", [
    (37, 75, 8, 64, 16), (19, 130, 64, 128, 40), (9, 20, 1, 64, 32), (1, 1, 1, 16, 1), (33, 300, 4, 32, 100),
])
@pytest.mark.parametrize("mask", ["full", "causal", "ratio4", "ragged"])
def test_topk_bf16(t, n, h, d, topk, mask, gen):
    q, k, w = _inputs(gen, t, n, h, d)
    ks, ke = mask_ranges(mask, t, n, gen)
    vals, idx = idsa.indexer_topk(*to_device_each(q, k, w), topk, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    assert_topk(vals, idx, reference.indexer_logits(q, k, w, ks, ke), topk)


@pytest.mark.parametrize("kind", ["mxfp4 q+k", "fp8 q+k fn", "fp8 k fnuz"])
def test_topk_quantised(kind, gen):
    q, k, w = _inputs(gen, 21, 90, 8, 128)
    qq, kk = quantised(kind, q, k, gen)
    ks, ke = reference.causal_ranges(21, 90)
    vals, idx = idsa.indexer_topk(*to_device_each(qq, kk, w), 24, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    assert_topk(vals, idx, reference.indexer_logits(qq, kk, w, ks, ke), 24, logits_tol(kind))


def test_topk_ties_exact_and_deterministic(gen):
    # small integers: every score is exact in fp32, many ties; ties go to the lower column
    q = torch.randint(-2, 3, (17, 4, 32), generator=gen).bfloat16()
    k = torch.randint(-1, 2, (60, 32), generator=gen).bfloat16()
    w = torch.randint(-2, 3, (17, 4), generator=gen).bfloat16()
    ks, ke = reference.causal_ranges(17, 60)
    want_v, want_i = reference.indexer_topk(q, k, w, 20, ks, ke)
    runs = [idsa.indexer_topk(*to_device_each(q, k, w), 20, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE)) for _ in range(2)]
    for v, i in runs:
        assert torch.equal(i.cpu(), want_i) and torch.equal(v.cpu(), want_v)


def test_topk_beyond_fused_limit_falls_back(gen):
    q, k, w = _inputs(gen, 3, 40, 2, 16)
    vals, idx = idsa.indexer_topk(*to_device_each(q, k, w), 2049)
    assert_topk(vals, idx, reference.indexer_logits(q, k, w), 2049)
    assert (idx[:, 40:] == -1).all()


def test_empty_inputs(gen):
    q, k, w = _inputs(gen, 0, 5, 2, 16)
    assert idsa.indexer_logits(*to_device_each(q, k, w)).shape == (0, 5)
    assert idsa.indexer_topk(*to_device_each(q, k, w), 3)[1].shape == (0, 3)
    q, k, w = _inputs(gen, 4, 0, 2, 16)
    assert idsa.indexer_logits(*to_device_each(q, k, w)).shape == (4, 0)
    v, i = idsa.indexer_topk(*to_device_each(q, k, w), 3)
    assert (i == -1).all() and (v == float("-inf")).all()


@pytest.mark.parametrize("t,n,topk", [(19, 75, 16), (9, 20, 32), (1, 1, 1), (13, 150, 60)])
@pytest.mark.parametrize("mask", ["full", "causal", "ratio4", "ragged"])
def test_logits_topk_matches_oracle(t, n, topk, mask, gen):
    # the select alone, on given fp32 logits (e.g. summed across TP ranks): exactly the oracle
    logits = torch.randint(-12, 13, (t, n), generator=gen) / 4.0  # many ties: the lower column wins
    ks, ke = mask_ranges(mask, t, n, gen)
    vals, idx = idsa.logits_topk(logits.to(DEVICE), topk, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    want_v, want_i = reference.logits_topk(logits, topk, ks, ke)
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)
    ref = logits.double().masked_fill(~reference.visible_mask(ks, ke, n), float("-inf"))
    assert_topk(vals, idx, ref, topk)


def test_logits_topk_transposed_and_empty(gen):
    logits = torch.randn(40, 13, generator=gen).t()  # [13, 40], last dim not contiguous
    vals, idx = idsa.logits_topk(logits.to(DEVICE), 8)
    want_v, want_i = reference.logits_topk(logits, 8, *reference.full_ranges(13, 40))
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)
    v, i = idsa.logits_topk(torch.randn(3, 0).to(DEVICE), 2)
    assert (i == -1).all() and (v == float("-inf")).all()
    with pytest.raises(TypeError, match="logits must be float32"):
        idsa.logits_topk(logits.double(), 2)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("topk", [3, 9, 2100])  # 2100 > 2048: the fallback path
def test_topk_special_values_rank_as_documented(topk):
    """README ranking, exactly: +0.0 == -0.0 (ties to the lower column), NaN below -inf (value -inf)."""
    logits = torch.tensor([[0.0, -0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                           [NAN, -INF, 1.0, NAN, -0.0, 0.0, -INF, INF, NAN]])
    want_i = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [7, 2, 4, 5, 1, 6, 0, 3, 8]], dtype=torch.int32)
    want_v = torch.tensor([[0.0] * 9, [INF, 1.0, 0.0, 0.0] + [-INF] * 5])
    vals, idx = idsa.logits_topk(logits.to(DEVICE), topk)
    ref_v, ref_i = reference.logits_topk(logits, topk, *reference.full_ranges(2, 9))
    m = min(topk, 9)
    for v, i in ((vals.cpu(), idx.cpu()), (ref_v, ref_i)):
        assert torch.equal(i[:, :m], want_i[:, :m]) and torch.equal(v[:, :m], want_v[:, :m])
        assert (i[:, m:] == -1).all() and (v[:, m:] == -INF).all()
