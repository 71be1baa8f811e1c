"""Near-misses: subgraphs that look like the indexer but compute something else.

Indexer near-misses (pass_corpus.py) and sparse-attention ones (attention_corpus.py).
Each must come out of the pass byte-for-byte unchanged (the FX graph's code before and
after our pass is compared), with no swap counted, and compute what eager computes.
With INDUCTOR_DSA_DEBUG=1 the report must say why the candidate was rejected.
"""
import pytest
import torch

from attention_corpus import ATTENTION_NEAR_MISSES
from pass_corpus import CASES, NEAR_MISSES
from pass_helpers import SnapshotPass, case_args, check_topk, compile_run, first_tensor_outputs, pass_only_backend

from inductor_dsa import lowering
from inductor_dsa.lowering import indexer as indexer_lowering
from inductor_dsa.symbolic import splice
from inductor_dsa.symbolic import Reject


ALL = NEAR_MISSES + ATTENTION_NEAR_MISSES


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_near_miss_is_left_untouched(case, monkeypatch):
    monkeypatch.setenv("INDUCTOR_DSA_DEBUG", "1")
    args = case.make(torch.float32, 0)
    snap = SnapshotPass()
    out, counts = compile_run(case.fn, args, backend=pass_only_backend(snap))
    assert counts == {}, f"a near-miss was swapped: {counts}"
    assert snap.before, "the pass did not run"
    assert snap.before == snap.after, "the pass changed a graph it did not swap"
    with torch.no_grad():
        eager = case.fn(*args)
    for o, e in zip(first_tensor_outputs(out), first_tensor_outputs(eager)):
        assert o.dtype == e.dtype and o.shape == e.shape
        if o.is_floating_point():
            torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(o, e)
    if case.reject is not None:
        reasons = [r.reason for r in lowering.report().rejections]
        assert any(case.reject in r for r in reasons), f"no rejection mentioning {case.reject!r}: {reasons}"


def test_mask_added_after_topk_is_not_folded_in(monkeypatch):
    """A bias added to the top-k values (after the selection) is not a mask of the scores: the
    top-k is swapped unmasked and the addition stays where it was."""
    monkeypatch.setenv("INDUCTOR_DSA_DEBUG", "1")
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(24, 4, 32, generator=g), torch.randn(20, 32, generator=g), torch.randn(24, 4, generator=g)
    bias = torch.randn(24, 4, generator=g).masked_fill(torch.rand(24, 4, generator=g) < 0.3, float("-inf"))

    def fn(q, k, w, bias):
        s = (torch.einsum("thd,kd->thk", q, k).relu() * w.unsqueeze(-1)).sum(1)
        v, i = s.topk(4)
        return v + bias, i
    out, counts = compile_run(fn, (q, k, w, bias))
    assert counts == {"indexer_topk": 1}, counts
    (swap,) = lowering.report().swaps
    assert "ranges  all keys" in swap.region and "mask    " not in swap.region, swap.region
    scores64 = (torch.einsum("thd,kd->thk", q.double(), k.double()).relu() * w.double().unsqueeze(-1)).sum(1)
    check_topk(out[1], scores64, 4)  # the top-k of the unmasked scores
    want = scores64.gather(1, out[1]) + bias.double()  # and the bias added to its values, -inf included
    torch.testing.assert_close(out[0].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stage", ["specialize", "trace"])
@pytest.mark.parametrize("error", [Reject("a late check failed"), RuntimeError("internal")])
def test_late_failure_leaves_graph_untouched(stage, error, monkeypatch):
    """A match that passes analysis but fails a later check (guard installation, tracing the
    replacement), or hits an internal error there, leaves the graph byte-for-byte unchanged
    and the compiled function computes what eager computes."""
    monkeypatch.delenv("INDUCTOR_DSA_STRICT", raising=False)  # internal errors: logged, not raised
    (case,) = [c for c in CASES if c.name == "official_fn_b1"]

    def fail(*a, **k):
        raise error
    if stage == "trace":
        monkeypatch.setattr(splice, "trace", fail)
    else:
        monkeypatch.setattr(indexer_lowering.Replacement, "specialize", fail)
    args = case_args(case, torch.float32)
    snap = SnapshotPass()
    out, counts = compile_run(case.fn, args, backend=pass_only_backend(snap))
    assert counts == {} and snap.before and snap.before == snap.after
    with torch.no_grad():
        assert torch.equal(out, case.fn(*args))
