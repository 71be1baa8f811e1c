"""inductor_dsa.sparse_attention against the float64 oracle (reference.sparse_attention).

Runs the Triton kernel: on CPU under TRITON_INTERPRET=1 (fp32 dots, so only the final bf16
rounding separates it from the oracle), or on a GPU (bf16 P @ V, looser tolerance).
Without either, the op would fall back to the oracle itself, so the module skips.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import inductor_dsa
from inductor_dsa import reference
from inductor_dsa.kernels import configs
from attention_cases import DEVICE, OUT_TOL, assert_close, check_special_sinks, make

if not configs.interpreting() and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU (else the op runs the oracle itself)",
                allow_module_level=True)


CASES = [  # b, m, h, d, n, topk, sink
    (1, 2, 8, 64, 50, 40, True),
    (2, 3, 16, 64, 37, 37, False),     # odd sizes, no sink
    (1, 2, 64, 64, 70, 33, True),      # H = 64: two interpreter head blocks
    (2, 1, 5, 32, 19, 23, True),       # odd H, topk > N
    (1, 2, 40, 16, 9, 20, False),      # partial last head block, tiny D
]


@pytest.mark.parametrize("b,m,h,d,n,topk,sink", CASES)
def test_matches_oracle(b, m, h, d, n, topk, sink):
    q, kv, idx, s = make(b, m, h, d, n, topk, sink=sink, seed=b * 100 + h)
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)


def test_head_dim_512():
    q, kv, idx, s = make(1, 1, 8, 512, 20, 17, seed=5)
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)


@pytest.mark.parametrize("sink", [False, True])
def test_masked_queries_are_zero(sink):
    q, kv, idx, s = make(2, 3, 8, 32, 30, 24, holes=0.5, sink=sink, seed=7)
    idx[0, 1] = -1                      # sees nothing
    idx[1, 2, :] = -1
    idx[1, 2, 17] = 4                   # exactly one valid slot, late in the list
    idx[1, 0, :16] = -1                 # first whole tile empty, later tiles not
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)
    assert torch.count_nonzero(out[0, 1]) == 0 and torch.isneginf(lse[0, 1]).all()
    if not sink:  # one slot, no sink: the output is that kv row (up to bf16 rounding)
        torch.testing.assert_close(out[1, 2].float(), kv[1, 4].float().expand(8, -1), rtol=0, atol=0)


def test_sink_and_repeats_change_the_result():
    """Guards the tolerance: dropping the sink or deduplicating slots must fail assert_close."""
    q, kv, idx, s = make(1, 2, 16, 64, 12, 30, holes=0.1, seed=11)  # topk > N: many repeats
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)
    with pytest.raises(AssertionError):
        assert_close(q, kv, idx, None, out, lse)
    dedup = idx.clone()
    for r in range(dedup.shape[1]):
        row = dedup[0, r]
        seen = set()
        for k in range(row.numel()):
            v = int(row[k])
            if v in seen:
                row[k] = -1
            seen.add(v)
    assert not torch.equal(dedup, idx)
    with pytest.raises(AssertionError):
        assert_close(q, kv, dedup, s, out, lse)


def test_scale_and_dtypes():
    q, kv, idx, s = make(1, 2, 8, 32, 25, 20, seed=13, dtype=torch.float16)
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, scale=0.3, return_lse=True)
    assert_close(q, kv, idx, s, out, lse, scale=0.3)
    q, kv, idx, s = make(1, 1, 8, 32, 25, 20, seed=14, dtype=torch.float32)
    out = inductor_dsa.sparse_attention(q, kv, idx.long(), sink=s.double())
    lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)[1]
    assert_close(q, kv, idx, s, out, lse)


@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_large_scale_fp32(scale):
    """fp32, |scale| 1e4: scores ~1e5, lse ~1e5. lse carries the fp32 rounding of its largest
    score (relative ~1e-7, measured: the same as a logsumexp of fp32-rounded scores, so nothing
    overflows or cancels); the absolute LSE_TOL cannot hold, a relative bound of 16 ulp does."""
    q, kv, idx, s = make(2, 2, 8, 64, 40, 17, seed=9, dtype=torch.float32)
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, scale=scale, return_lse=True)
    ref_out, ref_lse = reference.sparse_attention(q.cpu(), kv.cpu(), idx.cpu(), s.cpu(), scale)
    tol = OUT_TOL * kv.abs().max().item() + 2**-7 * ref_out.abs()
    assert ((out.cpu().double() - ref_out).abs() <= tol).all()
    assert (lse.cpu().double() - ref_lse).abs().max() <= 16 * 2**-24 * ref_lse.abs().max()
    assert ref_lse.abs().max() > 1e5


# D = 128: the combine runs 2 column chunks; 8 splits of 70 slots: the last ones are empty
@pytest.mark.parametrize("splits,d", [(2, 32), (3, 128), (8, 64)])
def test_split_kv(splits, d):
    from inductor_dsa.kernels import attention_launch
    q, kv, idx, s = make(1, 3, 16, d, 60, 70, holes=0.3, seed=17 + splits)
    idx[0, 0] = -1
    idx[0, 1, :40] = -1                 # some splits see nothing
    for sink in (s, None):
        out, lse = attention_launch.sparse_attention(q, kv, idx, sink, d**-0.5, splits=splits)
        assert_close(q, kv, idx, sink, out, lse)


def test_split_heuristic(monkeypatch):
    from inductor_dsa.kernels import attention_launch
    cfg = configs.SPARSE_ATTENTION["sm90"]
    assert attention_launch.sparse_attention_splits(torch.device("cpu"), cfg, 1, 4096) == 1
    monkeypatch.setattr(configs, "multiprocessors", lambda index: 132)
    cuda = torch.device("cuda", 0)
    got = {p: attention_launch.sparse_attention_splits(cuda, cfg, p, 1152) for p in (1, 16, 32, 64, 100, 128, 4096)}
    assert got == {1: 8, 16: 8, 32: 4, 64: 2, 100: 1, 128: 1, 4096: 1}  # fill one wave, split only below it
    assert attention_launch.sparse_attention_splits(cuda, cfg, 64, 2 * 2 * cfg.bn - 1) == 1  # >= 2 tiles per split
    assert attention_launch.sparse_attention_splits(cuda, cfg, 1, 640) == 640 // (2 * cfg.bn)  # batch-1 decode, top-640


@pytest.mark.parametrize("gather", [0, 1])
def test_gather_modes(monkeypatch, gather):
    key = configs.target_for(torch.device(DEVICE))
    cfg = dataclasses.replace(configs.SPARSE_ATTENTION[key], gather=gather)
    monkeypatch.setitem(configs.SPARSE_ATTENTION, key, cfg)
    q, kv, idx, s = make(1, 2, 8, 32, 40, 45, seed=19)
    out, lse = inductor_dsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)


def test_unchecked_out_of_range_is_masked():
    q, kv, idx, s = make(1, 2, 8, 32, 10, 12, holes=0.0, seed=23)
    bad = idx.clone()
    bad[0, 0, 3], bad[0, 1, 5], bad[0, 1, 6] = 10, -7, 1 << 30
    out, lse = inductor_dsa.sparse_attention(q, kv, bad, sink=s, check_indices=False, return_lse=True)
    assert_close(q, kv, torch.where((bad >= 0) & (bad < 10), bad, -1), s, out, lse)


def test_empty_batch():
    q, kv, idx, s = make(1, 1, 8, 32, 10, 4, seed=29)
    out, lse = inductor_dsa.sparse_attention(q[:, :0], kv, idx[:, :0], sink=s, return_lse=True)
    assert out.shape == (1, 0, 8, 32) and lse.shape == (1, 0, 8)


def test_opcheck_and_compile():
    q, kv, idx, s = make(1, 1, 8, 16, 10, 16, seed=31)
    torch.library.opcheck(torch.ops.inductor_dsa.sparse_attention.default, (q, kv, idx, s, 0.25),
                          test_utils=("test_schema", "test_faketensor"))
    from torch._inductor.utils import run_and_get_code
    f = torch.compile(lambda q, kv, idx, s: inductor_dsa.sparse_attention(q, kv, idx, sink=s) * 2,
                      fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        got, code = run_and_get_code(f, q, kv, idx, s)
    torch.testing.assert_close(got, inductor_dsa.sparse_attention(q, kv, idx, sink=s) * 2)
    assert "inductor_dsa.sparse_attention" in "\n".join(code)


def _bad(**over):
    q, kv, idx, s = make(1, 2, 8, 32, 10, 6, seed=37)
    args = dict(q=q, kv=kv, indices=idx, sink=s, scale=None)
    args.update(over)
    return args


BAD = [
    (dict(q="x"), TypeError, "q"),
    (dict(q=torch.zeros(1, 2, 8, 32, dtype=torch.float64)), TypeError, "q"),
    (dict(q=torch.zeros(2, 8, 32, dtype=torch.bfloat16)), ValueError, "q"),
    (dict(q=torch.zeros(1, 2, 8, 48, dtype=torch.bfloat16)), ValueError, "head_dim"),
    (dict(kv=torch.zeros(1, 10, 32, dtype=torch.float16)), TypeError, "kv"),
    (dict(kv=torch.zeros(2, 10, 32, dtype=torch.bfloat16)), ValueError, "kv"),
    (dict(kv=torch.zeros(1, 10, 64, dtype=torch.bfloat16)), ValueError, "kv"),
    (dict(indices=torch.zeros(1, 2, 6)), TypeError, "indices"),
    (dict(indices=torch.zeros(1, 3, 6, dtype=torch.int32)), ValueError, "indices"),
    (dict(indices=torch.zeros(1, 2, 0, dtype=torch.int32)), ValueError, "indices"),
    (dict(sink=torch.zeros(7)), ValueError, "sink"),
    (dict(sink=torch.zeros(8, dtype=torch.int32)), TypeError, "sink"),
    (dict(scale="0.1"), TypeError, "scale"),
    (dict(scale=True), TypeError, "scale"),
    (dict(scale=float("nan")), ValueError, "scale"),
]


@pytest.mark.parametrize("over,exc,name", BAD)
def test_bad_inputs_raise_before_launch(monkeypatch, over, exc, name):
    from inductor_dsa.kernels import attention_launch

    def no_launch(*a, **k):
        raise AssertionError("launched before validation")
    monkeypatch.setattr(attention_launch, "sparse_attention", no_launch)
    args = _bad(**{k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in over.items()})
    with pytest.raises(exc, match=name):
        inductor_dsa.sparse_attention(args["q"], args["kv"], args["indices"], sink=args["sink"], scale=args["scale"])


@pytest.mark.parametrize("value", [10, 11, -2, -(1 << 31)])
def test_out_of_range_indices_raise(monkeypatch, value):
    from inductor_dsa.kernels import attention_launch
    monkeypatch.setattr(attention_launch, "sparse_attention", lambda *a, **k: pytest.fail("launched"))
    args = _bad()
    args["indices"][0, 1, 2] = value
    with pytest.raises(ValueError, match=r"indices must lie in \[-1, 10\)"):
        inductor_dsa.sparse_attention(args["q"], args["kv"], args["indices"], sink=args["sink"])


@pytest.mark.parametrize("splits", [1, 2])
def test_special_sinks_and_nan_q(splits):
    """sink +inf: out 0; NaN sink: out NaN; -inf: no sink; lse never includes the sink; a NaN in q
    makes that query's out AND lse NaN (lse -inf would say 'no slot' and hide it in an lse merge)."""
    from inductor_dsa.kernels import attention_launch
    q, kv, idx, _ = make(1, 2, 4, 16, 20, 9, holes=0.2, seed=2, dtype=torch.float32, sink=False)

    def run(q, kv, i, s):
        q, kv, i = q.to(DEVICE), kv.to(DEVICE), i.to(DEVICE)
        out, lse = attention_launch.sparse_attention(q, kv, i, None if s is None else s.to(DEVICE), 16 ** -0.5, splits)
        return out.cpu(), lse.cpu()
    check_special_sinks(q.cpu(), kv.cpu(), idx.cpu(), run)
