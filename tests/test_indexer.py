"""Prefill indexer ops (logits, fused top-k) against the float64 oracle."""
import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import formats, reference
from conftest import DEVICE, misaligned_copy


def _inputs(gen, t, n, h, d, dtype=torch.bfloat16):
    q = torch.randn(t, h, d, generator=gen).to(dtype)
    k = torch.randn(n, d, generator=gen).to(dtype)
    w = torch.randn(t, h, generator=gen).to(dtype)  # signed, like weights_proj output
    return q, k, w


def _ranges(kind, t, n, gen):
    if kind == "full":
        return reference.full_ranges(t, n)
    if kind == "causal":
        return reference.causal_ranges(t, n)
    if kind == "ratio4":
        return reference.ratio_ranges(t, 4)
    # ragged: random starts/ends, some empty and some inverted rows, some past K
    a = torch.randint(-3, n + 3, (t,), generator=gen, dtype=torch.int32)
    b = torch.randint(-3, n + 3, (t,), generator=gen, dtype=torch.int32)
    return torch.minimum(a, b), torch.where(torch.arange(t) % 5 == 0, a - 1, torch.maximum(a, b))


def _dev(*xs):
    return [tuple(y.to(DEVICE) for y in x) if isinstance(x, tuple) else x.to(DEVICE) for x in xs]


def _assert_logits(out, ref, tol):
    out = out.cpu().double()
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN pattern differs"  # logits keep NaN
    assert torch.equal(torch.isfinite(out), fin) and torch.equal(out[~fin].nan_to_num(0.0), ref[~fin].nan_to_num(0.0))
    scale = ref[fin].abs().max() if fin.any() else 1.0
    assert ((out - ref)[fin].abs().max() if fin.any() else 0) <= tol * scale


SHAPES = [  # T, K, H, D
    (1, 1, 1, 64), (37, 75, 8, 64), (19, 130, 64, 128), (70, 33, 1, 16), (5, 3, 3, 128),
]


@pytest.mark.parametrize("t,n,h,d", SHAPES)
@pytest.mark.parametrize("mask", ["full", "causal", "ragged"])
def test_logits_bf16(t, n, h, d, mask, gen):
    q, k, w = _inputs(gen, t, n, h, d)
    ks, ke = _ranges(mask, t, n, gen)
    out = idsa.indexer_logits(*_dev(q, k, w), k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    assert out.dtype == torch.float32 and out.shape == (t, n)
    _assert_logits(out, reference.indexer_logits(q, k, w, ks, ke), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_logits_fp16_fp32(dtype, gen):
    q, k, w = _inputs(gen, 23, 41, 8, 64, dtype)
    out = idsa.indexer_logits(*_dev(q, k, w))
    _assert_logits(out, reference.indexer_logits(q, k, w), 1e-5)


def _tol(kind):
    # Hopper's native fp8 wgmma accumulates with a reduced-precision adder (~2**-13 relative)
    return 2e-3 if kind.startswith("fp8 q") and DEVICE == "cuda" else 1e-5


def _quantised(kind, q, k, gen):
    if kind == "mxfp4 k":
        return q, formats.mxfp4_encode(k)
    if kind == "mxfp4 q+k":
        return formats.mxfp4_encode(q), formats.mxfp4_encode(k)
    flavor = kind.split()[-1]
    kf8 = formats.fp8_encode_rows(k, flavor)
    if kind.startswith("fp8 q"):
        return q.float().clamp(-8, 8).to(formats.FP8_DTYPES[flavor]), kf8
    return q, kf8


@pytest.mark.parametrize("kind", ["mxfp4 k", "mxfp4 q+k", "fp8 k fn", "fp8 q+k fn", "fp8 q+k fnuz", "fp8 k fnuz"])
def test_logits_quantised(kind, gen):
    q, k, w = _inputs(gen, 29, 67, 8, 128)
    qq, kk = _quantised(kind, q, k, gen)
    ks, ke = reference.causal_ranges(29, 67)
    out = idsa.indexer_logits(*_dev(qq, kk, w), k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    _assert_logits(out, reference.indexer_logits(qq, kk, w, ks, ke), _tol(kind))


def test_logits_misaligned_mxfp4_keys(gen):
    # MXFP4 codes are read as 32-bit words; codes at an odd address take the byte-load path
    q, k, w = _inputs(gen, 13, 45, 8, 64)
    codes, scales = _dev(*formats.mxfp4_encode(k))
    odd = misaligned_copy(codes)
    assert odd.data_ptr() % 4
    qd, wd = _dev(q, w)
    assert torch.equal(idsa.indexer_logits(qd, (odd, scales), wd), idsa.indexer_logits(qd, (codes, scales), wd))


def _assert_topk(vals, idx, ref, topk, tol=1e-5):
    vals, idx = vals.cpu(), idx.cpu()
    assert vals.dtype == torch.float32 and idx.dtype == torch.int32
    assert idx.shape == (ref.shape[0], topk) and vals.shape == idx.shape
    msg = reference.topk_mismatch(idx, ref, topk)
    assert msg is None, msg
    taken = idx >= 0
    assert (vals[~taken] == float("-inf")).all()
    want = ref.gather(1, idx.long().clamp(min=0)).nan_to_num(float("-inf"), float("inf"), float("-inf"))  # NaN reads -inf
    assert torch.equal(torch.isneginf(vals) & taken, torch.isneginf(want) & taken)
    taken &= torch.isfinite(want)
    got, want = torch.where(taken, vals.double(), 0), torch.where(taken, want, 0)
    fin = ref[torch.isfinite(ref)]
    scale = fin.abs().max().item() if fin.numel() else 1.0
    assert (got - want).abs().max() <= tol * max(scale, 1.0)
    v = vals.masked_fill(~taken, float("-inf"))
    assert (v[:, :-1] >= v[:, 1:]).all()  # descending


@pytest.mark.parametrize("t,n,h,d,topk", [
    (37, 75, 8, 64, 16), (19, 130, 64, 128, 40), (9, 20, 1, 64, 32), (1, 1, 1, 16, 1), (33, 300, 4, 32, 100),
])
@pytest.mark.parametrize("mask", ["full", "causal", "ratio4", "ragged"])
def test_topk_bf16(t, n, h, d, topk, mask, gen):
    q, k, w = _inputs(gen, t, n, h, d)
    ks, ke = _ranges(mask, t, n, gen)
    vals, idx = idsa.indexer_topk(*_dev(q, k, w), topk, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    _assert_topk(vals, idx, reference.indexer_logits(q, k, w, ks, ke), topk)


@pytest.mark.parametrize("kind", ["mxfp4 q+k", "fp8 q+k fn", "fp8 k fnuz"])
def test_topk_quantised(kind, gen):
    q, k, w = _inputs(gen, 21, 90, 8, 128)
    qq, kk = _quantised(kind, q, k, gen)
    ks, ke = reference.causal_ranges(21, 90)
    vals, idx = idsa.indexer_topk(*_dev(qq, kk, w), 24, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    _assert_topk(vals, idx, reference.indexer_logits(qq, kk, w, ks, ke), 24, _tol(kind))


def test_topk_ties_exact_and_deterministic(gen):
    # small integers: every score is exact in fp32, many ties; ties go to the lower column
    q = torch.randint(-2, 3, (17, 4, 32), generator=gen).bfloat16()
    k = torch.randint(-1, 2, (60, 32), generator=gen).bfloat16()
    w = torch.randint(-2, 3, (17, 4), generator=gen).bfloat16()
    ks, ke = reference.causal_ranges(17, 60)
    want_v, want_i = reference.indexer_topk(q, k, w, 20, ks, ke)
    runs = [idsa.indexer_topk(*_dev(q, k, w), 20, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE)) for _ in range(2)]
    for v, i in runs:
        assert torch.equal(i.cpu(), want_i) and torch.equal(v.cpu(), want_v)


def test_topk_beyond_fused_limit_falls_back(gen):
    q, k, w = _inputs(gen, 3, 40, 2, 16)
    vals, idx = idsa.indexer_topk(*_dev(q, k, w), 2049)
    _assert_topk(vals, idx, reference.indexer_logits(q, k, w), 2049)
    assert (idx[:, 40:] == -1).all()


def test_empty_inputs(gen):
    q, k, w = _inputs(gen, 0, 5, 2, 16)
    assert idsa.indexer_logits(*_dev(q, k, w)).shape == (0, 5)
    assert idsa.indexer_topk(*_dev(q, k, w), 3)[1].shape == (0, 3)
    q, k, w = _inputs(gen, 4, 0, 2, 16)
    assert idsa.indexer_logits(*_dev(q, k, w)).shape == (4, 0)
    v, i = idsa.indexer_topk(*_dev(q, k, w), 3)
    assert (i == -1).all() and (v == float("-inf")).all()


@pytest.mark.parametrize("t,n,topk", [(19, 75, 16), (9, 20, 32), (1, 1, 1), (13, 150, 60)])
@pytest.mark.parametrize("mask", ["full", "causal", "ratio4", "ragged"])
def test_logits_topk_matches_oracle(t, n, topk, mask, gen):
    # the select alone, on given fp32 logits (e.g. summed across TP ranks): exactly the oracle
    logits = torch.randint(-12, 13, (t, n), generator=gen) / 4.0  # many ties: the lower column wins
    ks, ke = _ranges(mask, t, n, gen)
    vals, idx = idsa.logits_topk(logits.to(DEVICE), topk, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    want_v, want_i = reference.logits_topk(logits, topk, ks, ke)
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)
    ref = logits.double().masked_fill(~reference.visible_mask(ks, ke, n), float("-inf"))
    _assert_topk(vals, idx, ref, topk)


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
