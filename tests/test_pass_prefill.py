"""The prefill indexer corpus: every spelling must be swapped, and stay correct.

Compiled through Inductor's compile_fx with the pass (code generation replaced by running
the rewritten FX graph, see pass_helpers.pass_only_backend); tests/test_pass_e2e.py covers
real code generation. On CPU the inductor_dsa ops run the float64 reference.
"""
import contextlib

import pytest
import torch

from pass_corpus import CASES
from pass_helpers import check_logits, check_topk, compile_run, oracle

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt).replace('torch.', '')}")
          for c in CASES for dt in c.dtypes]


@contextlib.contextmanager
def default_dtype(dt):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def _args(case, dtype, seed=0):
    made = case.make(dtype, seed)
    if isinstance(made[0], torch.nn.Module):  # (module, inputs): call the module
        return (made[0], made[1])
    return made


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_prefill_spelling_is_swapped_and_correct(case, dtype):
    args = _args(case, dtype)
    with default_dtype(dtype if dtype == torch.bfloat16 else torch.float32):
        out, counts = compile_run(case.fn, args)
        with torch.no_grad():
            eager = case.fn(*args)
    assert counts == case.swaps, f"expected swaps {case.swaps}, got {counts}"
    ref, captured = oracle(case.fn, args)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-3
    if case.kind == "logits":
        assert out.dtype == eager.dtype and out.shape == eager.shape
        check_logits(out, ref, eager, rel_tol=tol)
        return
    (logits64,) = captured
    if case.outputs == "both":
        (vals, idx), (evals, eidx) = out, eager
        assert vals.dtype == evals.dtype and idx.dtype == eidx.dtype == torch.int64
        assert vals.shape == evals.shape and idx.shape == eidx.shape
        check_topk(idx, logits64, idx.shape[-1], values=vals, rel_tol=tol)
    elif case.outputs == "indices":
        assert out.dtype == eager.dtype and out.shape == eager.shape
        check_topk(out, logits64, out.shape[-1], post=case.post, rel_tol=tol)
    else:  # values only: compare with the oracle's sorted top-k values
        assert out.dtype == eager.dtype and out.shape == eager.shape
        want = torch.topk(logits64, out.shape[-1], dim=-1).values
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=1e-3)
