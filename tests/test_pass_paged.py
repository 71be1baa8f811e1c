"""The paged decode corpus: every spelling becomes one paged op call and agrees with the
float64 oracle of that op (reference.paged_indexer_logits); every near-miss stays exactly as it
was and equals eager. Compiled like test_pass_prefill (Inductor's compile_fx with the pass,
code generation replaced by running the graph); one test runs real code generation with
``inductor_dsa.backend``. Kernels run under the Triton interpreter on CPU.
"""
import pytest
import torch

import inductor_dsa
from inductor_dsa import lowering, reference
from paged_corpus import (PAGED_CASES, PAGED_NEAR_MISSES, make_decode_inputs, module_call,
                          paged_indexer_decode)
from pass_helpers import (SnapshotPass, case_args, check_case, check_logits, check_topk, compile_run,
                          default_dtype, first_tensor_outputs, pass_only_backend)



def _oracle(case, args):
    """The op's oracle on eager's view of the inputs: a negative page id wraps (``cache[table]``),
    a length is clamped to the keys before it narrows to int32 (unless the case narrows it itself)."""
    q, cache, w, table, lens = args
    table = torch.where(table < 0, table + cache.shape[0], table).int()
    lens = case.extra.get("lens", lambda x: x.clamp(0, 64 * table.shape[1]).int())(lens)
    lut = case.extra.get("table")
    return reference.paged_indexer_logits(q, cache.reshape(cache.shape[0], -1), w, table, lens,
                                          "fp8" if "fp8" in case.name else "mxfp4",
                                          table=None if lut is None else torch.tensor(lut))


def _check(case, args, out, eager):
    if case.fn is module_call:  # q and weights come from the module: the generic fp64 run
        check_case(case, torch.bfloat16, args, out, eager)
        return
    logits64 = _oracle(case, args)
    if case.kind == "logits":
        assert out.dtype == eager.dtype and out.shape == eager.shape
        check_logits(out, logits64, eager, rel_tol=1e-3)
        return
    if case.outputs == "both":
        (vals, idx), (evals, _) = out, eager
        assert vals.dtype == evals.dtype and idx.dtype == torch.int64 and vals.shape == evals.shape
        check_topk(idx, logits64, idx.shape[-1], values=vals, rel_tol=1e-3)
    else:
        assert out.dtype == eager.dtype and out.shape == eager.shape
        check_topk(out, logits64, out.shape[-1], post=case.post, rel_tol=1e-3)


def _mark_dynamic(args):
    """Batch, context pages and cache pages vary at run time; head_dim and the row size are
    model constants (the proof needs them as numbers)."""
    inputs = args[1] if isinstance(args[0], torch.nn.Module) else args
    for x in inputs:
        torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(inputs[3], 1)  # block_table: pages per request


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", PAGED_CASES, ids=[c.name for c in PAGED_CASES])
def test_paged_spelling_is_swapped_and_correct(case, dynamic):
    dt = case.dtypes[0]
    args = case_args(case, dt, seed=1 + dynamic)
    if dynamic:
        _mark_dynamic(args)
    with default_dtype(dt):
        out, counts = compile_run(case.fn, args)
        with torch.no_grad():
            eager = case.fn(*args)
    assert counts == case.swaps, f"expected swaps {case.swaps}, got {counts}"
    _check(case, args, out, eager)


@pytest.mark.parametrize("case", PAGED_NEAR_MISSES, ids=[c.name for c in PAGED_NEAR_MISSES])
def test_paged_near_miss_is_left_untouched(case, monkeypatch):
    monkeypatch.setenv("INDUCTOR_DSA_DEBUG", "1")
    args = case.make(torch.float32, 0)
    snap = SnapshotPass()
    out, counts = compile_run(case.fn, args, backend=pass_only_backend(snap))
    assert counts == {}, f"a near-miss was swapped: {counts}"
    assert snap.before and snap.before == snap.after, "the pass changed a graph it did not swap"
    with torch.no_grad():
        eager = case.fn(*args)
    for o, e in zip(first_tensor_outputs(out), first_tensor_outputs(eager)):
        assert o.dtype == e.dtype and o.shape == e.shape
        if o.is_floating_point():  # (a wrong layout reads 0xFF scale bytes: NaN in both)
            torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            assert torch.equal(o, e)
    reasons = [r.reason for r in lowering.report().rejections]
    assert any(case.reject in r for r in reasons), f"no rejection mentioning {case.reject!r}: {reasons}"


def test_backend_generated_code_calls_paged_indexer_topk():
    """Real Inductor code generation: the op is named in the generated code, results agree."""
    from torch._inductor.utils import run_and_get_code
    args = make_decode_inputs()(torch.float32, 5)
    torch._dynamo.reset()
    lowering.reset()
    f = torch.compile(paged_indexer_decode, backend=inductor_dsa.backend, fullgraph=True)
    with torch.no_grad():
        (vals, idx), code = run_and_get_code(f, *args)
    assert "inductor_dsa.paged_indexer_topk" in "\n".join(code)
    assert dict(lowering.counters) == {"paged_indexer_topk": 1}
    check_topk(idx, _oracle(PAGED_CASES[0], args), idx.shape[-1], values=vals, rel_tol=1e-3)
