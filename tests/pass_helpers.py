"""Shared helpers for tests/test_pass_*.py (compiling, counting swaps, fp64 oracles)."""
from __future__ import annotations

import contextlib
import copy
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] != ROOT:
    sys.path.insert(0, ROOT)
os.environ.setdefault("INDUCTOR_DSA_STRICT", "1")  # a matcher bug fails the test, not silently skips

import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

import inductor_dsa  # noqa: E402
from inductor_dsa import lowering, reference  # noqa: E402
from inductor_dsa.lowering.install import with_ours  # noqa: E402

assert os.path.abspath(inductor_dsa.__file__).startswith(ROOT), (
    f"tests import inductor_dsa from {inductor_dsa.__file__}, not from this checkout {ROOT}")

inductor_config.force_disable_caches = True  # a cached graph would skip the pass


class SnapshotPass(CustomGraphPass):
    """Runs the inductor_dsa pass and keeps the graph's code before and after it."""

    def __init__(self):
        self.inner = with_ours(None)
        self.before, self.after = [], []

    def __call__(self, graph):
        self.before.append(graph.python_code("self").src)
        self.inner(graph)
        self.after.append(graph.python_code("self").src)

    def uuid(self):
        return None


def pass_only_backend(snapshot: SnapshotPass | None = None):
    """Inductor's compile_fx with our pass first and no code generation (the FX graph runs):
    see ``lowering.graph_only_backend``. Tests that need real code generation use
    ``inductor_dsa.backend``."""
    return lowering.graph_only_backend(snapshot if snapshot is not None else with_ours(None))


def compile_run(fn, args, backend=None, dynamic=None):
    """Compile ``fn`` fresh, run it on ``args``; returns (output, swap counts)."""
    torch._dynamo.reset()
    lowering.reset()
    backend = backend if backend is not None else pass_only_backend()
    with torch.no_grad():
        out = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*args)
    return out, dict(lowering.counters)


# ---- fp64 oracle --------------------------------------------------------------------------------
_DOWNCASTS = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}
_EXACT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)  # exact in float64


class CaptureTopk(TorchFunctionMode):
    """Records the input of every top-k call; keeps float64 through explicit float casts
    (``.float()``, ``.to(torch.float32)``), and casts integers to float64 there, so the oracle really
    is float64."""

    def __init__(self):
        super().__init__()
        self.inputs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.topk, torch.Tensor.topk):
            self.inputs.append(args[0].detach().clone())
        float_cast = func in _DOWNCASTS
        if func is torch.Tensor.to:
            dt = kwargs.get("dtype", args[1] if len(args) > 1 else None)
            float_cast = isinstance(dt, torch.dtype) and dt.is_floating_point
        src = args[0]
        if float_cast and isinstance(src, torch.Tensor) and src.dtype in (torch.float64, *_EXACT):
            return src.double()  # integer positions (rotary embeddings) too: float64, not float32
        return func(*args, **kwargs)


def to64(x):
    if isinstance(x, torch.nn.Module):
        return copy.deepcopy(x).double()
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().double()
    if isinstance(x, (tuple, list)):
        return type(x)(to64(a) for a in x)
    return x


def oracle(fn, args):
    """(output, captured top-k inputs) of ``fn`` run eagerly in float64 on the same values."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad(), CaptureTopk() as cap:
            out = fn(*to64(args))
    finally:
        torch.set_default_dtype(prev)
    return out, cap.inputs


def masked_to_inf(logits64):
    """Scores at or below any float dtype's finfo.min are masked: make them -inf."""
    return logits64.masked_fill(logits64 <= torch.finfo(torch.bfloat16).min, float("-inf"))


def check_topk(indices, logits64, k, *, post=False, values=None, rel_tol=1e-2):
    """Assert ``indices`` (and ``values``) are a valid top-k of the fp64 oracle logits.

    Without ``post``, slots past a row's visible count must hold distinct masked columns
    (what eager top-k returns there); they are mapped to -1 before the set comparison.
    """
    logits64 = masked_to_inf(logits64).reshape(-1, logits64.shape[-1])
    idx = indices.reshape(-1, indices.shape[-1]).long()
    assert idx.shape[1] == k
    vis = torch.isfinite(logits64)
    if not post:
        assert ((idx >= 0) & (idx < logits64.shape[1])).all(), "an index outside [0, K)"
        for r in range(idx.shape[0]):
            assert idx[r].unique().numel() == k, f"row {r}: repeated index {idx[r].tolist()}"
        hidden = ~torch.gather(vis, 1, idx)
        idx = idx.masked_fill(hidden, -1)
    msg = reference.topk_mismatch(idx, logits64, k, rel_tol=rel_tol)
    assert msg is None, msg
    if values is not None:
        v = values.reshape(-1, k).double()
        safe = idx.clamp(min=0)
        want = torch.gather(logits64, 1, safe)
        real = idx >= 0
        tol = 1e-3 + rel_tol * want[real].abs().max() if real.any() else 0
        assert ((v[real] - want[real]).abs() <= tol).all(), "top-k values differ from the oracle"
        fills = v[~real]
        assert ((fills == float("-inf")) | (fills <= torch.finfo(torch.bfloat16).min)).all(), \
            "empty slots must hold the mask fill"


def check_logits(out, ref64, eager=None, rel_tol=1e-2):
    """Finite entries close to the fp64 oracle (and no worse than eager), masked entries equal.

    "No worse than eager" is 1.05x eager's error, or 2^-16 of the largest score where eager's error is
    below that: fp32 sums in another order (the matrix units' truncating accumulators, a split fp32
    query's part products) land a few fp32 ulps away from eager's, while any rounding of an operand
    or result to bf16 / fp16 (2^-9 / 2^-12 relative) or TF32 (2^-11) is still at least 16x over."""
    ref = masked_to_inf(ref64)
    o = masked_to_inf(out.double())
    assert o.shape == ref.shape
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(o)), "masked positions differ"
    err = (o[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    scale = ref[fin].abs().max().item() if fin.any() else 1.0
    assert err <= 1e-4 + rel_tol * scale, f"max error {err} vs scale {scale}"
    if eager is not None and fin.any():
        e_err = (masked_to_inf(eager.double())[fin] - ref[fin]).abs().max().item()
        assert err <= max(e_err * 1.05 + 1e-6, scale * 2.0 ** -16), \
            f"fused error {err} worse than eager {e_err} (largest score {scale})"


def first_tensor_outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def case_args(case, dtype, seed=0):
    made = case.make(dtype, seed)
    if isinstance(made[0], torch.nn.Module):  # (module, inputs): the snippet calls the module
        return (made[0], made[1])
    return made


def check_case(case, dtype, args, out, eager):
    """Check a compiled corpus result against the fp64 oracle and eager's dtypes/shapes."""
    ref, captured = oracle(case.fn, args)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-3
    if case.kind == "logits":
        assert out.dtype == eager.dtype and out.shape == eager.shape
        check_logits(out, ref, eager, rel_tol=tol)
        hidden = ~torch.isfinite(masked_to_inf(eager.double()))
        assert torch.equal(out[hidden], eager[hidden]), "masked entries differ from eager's fill"
        return
    (logits64,) = captured
    if case.outputs == "both":
        (vals, idx), (evals, eidx) = out, eager
        assert vals.dtype == evals.dtype and idx.dtype == eidx.dtype == torch.int64
        assert vals.shape == evals.shape and idx.shape == eidx.shape
        check_topk(idx, logits64, idx.shape[-1], values=vals, rel_tol=tol)
        return
    assert out.dtype == eager.dtype and out.shape == eager.shape
    if case.outputs == "indices":
        check_topk(out, logits64, out.shape[-1], post=case.post, rel_tol=tol)
    else:  # values only: compare with the oracle's sorted top-k values
        want = torch.topk(masked_to_inf(logits64), out.shape[-1], dim=-1).values
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=1e-3)


@contextlib.contextmanager
def default_dtype(dt):
    """torch's default dtype set to ``dt`` inside the block (restored after)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)
