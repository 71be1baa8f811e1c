"""Bad input is rejected before any launch with TypeError/ValueError naming the argument."""
import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import formats

T, H, D, K = 4, 2, 32, 6


def _ok():
    return torch.randn(T, H, D).bfloat16(), torch.randn(K, D).bfloat16(), torch.randn(T, H)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda q, k, w: (q[0], k, w), ValueError, "q must be"),
    (lambda q, k, w: (q, k[:, :16], w), ValueError, "head_dim"),
    (lambda q, k, w: (q, k, w[:, :1]), ValueError, "weights must have shape"),
    (lambda q, k, w: (q, k.half(), w), TypeError, "share a dtype"),
    (lambda q, k, w: (q.int(), k, w), TypeError, "q must be bf16"),
    (lambda q, k, w: (q, k, w.int()), TypeError, "weights must be"),
    (lambda q, k, w: (q[..., :24], k[:, :24], w), ValueError, "power of two"),
    (lambda q, k, w: ("q", k, w), TypeError, "q must be a torch.Tensor"),
    (lambda q, k, w: (q, (k,), w), TypeError, "pair"),
    (lambda q, k, w: (q, (k.view(torch.uint8), torch.zeros(K, 2, dtype=torch.uint8)), w), ValueError, "k\\[1\\]"),
    (lambda q, k, w: (q, (k.view(torch.uint8)[:, :16], torch.zeros(K, 1)), w), TypeError, "E8M0"),
    (lambda q, k, w: (q, (k.float().to(torch.float8_e4m3fn), torch.ones(K + 1)), w), ValueError, "row scales"),
    (lambda q, k, w: (q, (k.float().to(torch.float8_e4m3fn), torch.ones(K).half()), w), TypeError, "row scales"),
    (lambda q, k, w: (q.float().to(torch.float8_e4m3fn), k, w), TypeError, "fp8 q"),
    (lambda q, k, w: (q.half(), formats.mxfp4_encode(k), w), TypeError, "quantised k"),
    (lambda q, k, w: (q, k, w.to("meta")), ValueError, "on meta"),
])
def test_bad_operands(mutate, exc, match):
    q, k, w = mutate(*_ok())
    with pytest.raises(exc, match=match):
        idsa.indexer_logits(q, k, w)
    with pytest.raises(exc, match=match):
        idsa.indexer_topk(q, k, w, 2)


@pytest.mark.parametrize("topk,exc", [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_topk(topk, exc):
    with pytest.raises(exc, match="topk"):
        idsa.indexer_topk(*_ok(), topk)


@pytest.mark.parametrize("ks,ke,exc,match", [
    (torch.zeros(T, dtype=torch.int32), None, ValueError, "both"),
    (torch.zeros(T), torch.ones(T), TypeError, "k_start must be an integer"),
    (torch.zeros(T + 1, dtype=torch.int32), torch.ones(T + 1, dtype=torch.int32), ValueError, "k_start must have shape"),
    (torch.zeros(T, dtype=torch.int32, device="meta"), torch.ones(T, dtype=torch.int32), ValueError, "k_start is on"),
])
def test_bad_ranges(ks, ke, exc, match):
    with pytest.raises(exc, match=match):
        idsa.indexer_logits(*_ok(), k_start=ks, k_end=ke)


def test_int64_ranges_accepted():
    q, k, w = _ok()
    out = idsa.indexer_logits(q, k, w, k_start=torch.zeros(T, dtype=torch.int64), k_end=torch.full((T,), 3))
    assert torch.isfinite(out[:, :3]).all() and (out[:, 3:] == float("-inf")).all()
