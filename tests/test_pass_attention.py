"""The sparse-attention corpus: every spelling is swapped to inductor_dsa.sparse_attention and
agrees with the float64 oracle (reference.sparse_attention), NaN where eager gives NaN.

Compiled with ``inductor_dsa.backend`` (real Inductor code generation); the op runs the
Triton kernel under the interpreter on CPU. Near-misses are in test_pass_nearmiss.py.
"""
import pytest
import torch

import inductor_dsa
from attention_corpus import ATTENTION_CASES, make_attention, oracle_inputs, to_case_layout
from inductor_dsa import lowering, reference
from inductor_dsa.kernels import configs
from pass_helpers import case_args, compile_run

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt).replace('torch.', '')}")
          for c in ATTENTION_CASES for dt in c.dtypes]


def _call(case, args):
    with torch.no_grad():
        return case.fn(*args)


def check_attention(case, args, out, eager):
    """Same dtype/shape as eager; NaN exactly where eager has NaN (queries with no slot and no
    sink in the shift); elsewhere close to the fp64 oracle and no further from it than eager."""
    assert out.dtype == eager.dtype and out.shape == eager.shape
    q, kv, idx, sink = oracle_inputs(case, args)
    ref, _ = reference.sparse_attention(q, kv, idx, sink, case.extra["scale"])
    empty = to_case_layout(case, (idx < 0).all(-1)[:, :, None, None].expand(ref.shape))
    ref = to_case_layout(case, ref)
    nan = torch.isnan(eager)
    assert empty.any(), "the inputs must hold a query that sees nothing"
    assert torch.equal(nan, empty if case.extra["empty"] == "nan" else torch.zeros_like(empty))
    assert torch.equal(torch.isnan(out), nan), "NaN pattern differs from eager"
    ok = ~nan
    err = (out[ok].double() - ref[ok]).abs()
    e_err = (eager[ok].double() - ref[ok]).abs().max().item()
    # the op's accuracy (tests/test_sparse_attention.py): one bf16 rounding of out, fp32 otherwise
    rel = 2.0 ** -7 if out.dtype == torch.bfloat16 else 1e-5
    assert (err <= 1e-4 * kv.abs().max() + rel * ref[ok].abs()).all(), f"max error {err.max().item():.3g}"
    # eager may round its output once where the op rounds once too: allow that rounding (a whole
    # ulp under the interpreter, whose fp32 -> bf16 store truncates)
    ulp = (2.0 ** -7 if configs.interpreting() else 2.0 ** -9) * ref[ok].abs().max().item()
    slack = ulp if out.dtype == torch.bfloat16 else 1e-6
    assert err.max().item() <= e_err + slack, f"error {err.max().item():.3g} > eager's {e_err:.3g}"


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_attention_spelling_is_swapped_and_correct(case, dtype):
    args = case_args(case, dtype)
    out, counts = compile_run(case.fn, args, backend=inductor_dsa.backend)
    assert counts == case.swaps, f"expected swaps {case.swaps}, got {counts}: {lowering.report()}"
    check_attention(case, args, out, _call(case, args))


DYN = [c for c in ATTENTION_CASES if c.extra.get("dynamic")]


@pytest.mark.parametrize("case", DYN, ids=[c.name for c in DYN])
def test_attention_spelling_matches_with_symbolic_sizes(case):
    args = case_args(case, torch.float32, seed=3)
    out, counts = compile_run(case.fn, args, dynamic=True)
    assert counts == case.swaps
    check_attention(case, args, out, _call(case, args))


def test_symbolic_float_scale_is_rejected(monkeypatch):
    """dynamic=True turns a float argument into a graph input: not a constant the op can take."""
    monkeypatch.setenv("INDUCTOR_DSA_DEBUG", "1")
    (case,) = [c for c in ATTENTION_CASES if c.name == "gather_explicit_sink"]
    args = case_args(case, torch.float32)
    out, counts = compile_run(case.fn, args, dynamic=True)
    assert counts == {}
    assert any("run-time tensor" in r.reason for r in lowering.report().rejections)
    torch.testing.assert_close(out, _call(case, args), equal_nan=True)


def test_mark_dynamic_module_compiles_once_for_several_lengths():
    """Real code generation; query and top-k lengths marked dynamic: one graph, always swapped."""
    torch._dynamo.reset()
    lowering.reset()
    (case,) = [c for c in ATTENTION_CASES if c.name == "module_cat_sink"]
    m, _ = case.make(torch.float32, 0)
    f = torch.compile(m, backend=inductor_dsa.backend)
    for i, (rows, topk) in enumerate(((3, 7), (5, 9), (4, 12))):
        q, kv, idx, _ = make_attention(m=rows, topk=topk)(torch.float32, i)
        for x, d in ((q, 1), (idx, 1), (idx, 2)):
            torch._dynamo.mark_dynamic(x, d)
        with torch.no_grad():
            out = f(q, kv, idx)
        check_attention(case, (m, (q, kv, idx)), out, _call(case, (m, (q, kv, idx))))
    rep = lowering.report()
    assert len(rep) <= 2 and all(c.swaps for c in rep), str(rep)
