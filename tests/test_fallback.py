"""The production fallback (``inductor_dsa/fallback.py``: CPU without the interpreter, and top-k
above 2048 everywhere) against the float64 oracle and the README's semantics; and the rule that
no production module imports ``reference.py``.

The public ops are run with ``configs.use_kernels`` forced off, which is what a CPU without
``TRITON_INTERPRET=1`` does.
"""
import ast
import pathlib
import subprocess
import sys

import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import checks, fallback, reference
from inductor_dsa.kernels import configs
from attention_cases import assert_close, check_special_sinks, make
from indexer_cases import assert_logits, assert_topk, quantised
from paged_cases import assert_paged_topk, make_case, paged_oracle

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def no_kernels(monkeypatch):
    monkeypatch.setattr(configs, "use_kernels", lambda device: False)


def test_no_production_module_imports_reference():
    for path in (ROOT / "inductor_dsa").rglob("*.py"):
        if path.name == "reference.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else [])
            mod = getattr(node, "module", None) or ""
            assert "reference" not in names and not mod.endswith("reference"), f"{path} imports reference"
    code = "import sys, inductor_dsa; assert 'inductor_dsa.reference' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize("kind", ["bf16", "fp32", "mxfp4 q+k", "fp8 q+k fn", "fp8 k fnuz"])
def test_indexer_ops_match_oracle(kind, no_kernels, gen):
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    q = torch.randn(13, 3, 32, generator=gen).to(dtype)
    k = torch.randn(29, 32, generator=gen).to(dtype)
    w = torch.randn(13, 3, generator=gen)
    q[0, 1, 3] = NAN                                   # a NaN row (relu keeps NaN)
    if kind not in ("bf16", "fp32"):
        q, k = quantised(kind, q, k, gen)
    ks = torch.randint(-2, 20, (13,), generator=gen, dtype=torch.int32)
    ke = ks + torch.randint(-3, 25, (13,), generator=gen, dtype=torch.int32)
    ref = reference.indexer_logits(q, k, w, ks, ke)
    assert_logits(idsa.indexer_logits(q, k, w, k_start=ks, k_end=ke), ref, 1e-5)
    for topk in (1, 7, 40):
        assert_topk(*idsa.indexer_topk(q, k, w, topk, k_start=ks, k_end=ke), ref, topk)


def test_topk_special_values_exact(no_kernels, gen):
    """NaN below -inf (value -inf), +0.0 == -0.0, ties to the lower column, -1 / -inf padding."""
    pool = torch.tensor([NAN, -NAN, -INF, INF, -0.0, 0.0, 1.0, -1.0, 1e-40, -1e-40])
    logits = pool[torch.randint(0, len(pool), (20, 33), generator=gen)]
    ks = torch.randint(-2, 30, (20,), generator=gen, dtype=torch.int32)
    ke = ks + torch.randint(-2, 30, (20,), generator=gen, dtype=torch.int32)
    for topk in (1, 5, 33, 50):
        want = reference.logits_topk(logits, topk, ks, ke)
        got = idsa.logits_topk(logits, topk, k_start=ks, k_end=ke)
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    _, idx = idsa.logits_topk(torch.tensor([[0.0, -0.0, 0.0, -0.0]]), 4)
    assert idx.tolist() == [[0, 1, 2, 3]]


def test_f32_keys_order():
    x = torch.tensor([NAN, -INF, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, 3e38, INF, -NAN])
    k = fallback.f32_keys(x)
    assert k[0] == k[-1] == fallback.NAN_KEY > fallback.HIDDEN_KEY and k[5] == k[6]
    k = k[:-1]
    assert (k[1:5] < k[2:6]).all() and (k[6:-1] < k[7:]).all() and (k[0] < k[1:]).all()


@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fnuz")])
def test_paged_ops_match_oracle(fmt, flavor, no_kernels, gen):
    case = make_case(gen, fmt=fmt, flavor=flavor, n=2, h=3, d=32, ctx=[0, 1, 65, 190])
    ref = paged_oracle(case, fmt, flavor)
    got = idsa.paged_indexer_logits(*case, fmt=fmt, fp8_flavor=flavor)
    assert_logits(got.reshape(-1, ref.shape[-1]), ref.reshape(-1, ref.shape[-1]), 1e-5)
    for topk in (1, 9, 200):
        assert_paged_topk(*idsa.paged_indexer_topk(*case, topk, fmt=fmt, fp8_flavor=flavor), ref, topk)


@pytest.mark.parametrize("sink", [False, True])
def test_sparse_attention_matches_oracle(sink, no_kernels):
    q, kv, idx, s = make(2, 3, 5, 32, 19, 23, holes=0.3, seed=4, sink=sink)
    idx[1, 2] = -1                                               # a query with no slot
    out, lse = idsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)
    assert (out[1, 2] == 0).all() and torch.isneginf(lse[1, 2]).all()


def test_sparse_attention_special_sinks_and_nan(no_kernels):
    q, kv, idx, _ = make(1, 2, 4, 16, 20, 9, holes=0.2, seed=2, dtype=torch.float32, sink=False)
    check_special_sinks(q.cpu(), kv.cpu(), idx.cpu(),
                        lambda q, kv, i, s: idsa.sparse_attention(q, kv, i, sink=s, return_lse=True))


def test_paged_gather_matches_kernel(monkeypatch, gen):
    """The fallback's byte copy equals the gather kernel's (interpreter or GPU)."""
    _, cache, _, bt, cl = make_case(gen, fmt="mxfp4", n=1, h=2, d=32, ctx=[0, 70, 20, 500])
    run = lambda: idsa.paged_gather(cache, bt, cl, fmt="mxfp4", total_rows=100, check_values=False)
    (a, s), ks, ke = run()
    monkeypatch.setattr(configs, "use_kernels", lambda device: False)
    (fa, fs), fks, fke = run()
    for got, exp in zip((fa, fs, fks, fke), (a, s, ks, ke)):
        assert torch.equal(got, exp)


def test_values_checks_still_run(no_kernels, gen):
    _, cache, _, bt, cl = make_case(gen, fmt="mxfp4", n=1, h=2, d=32, ctx=[5])
    with pytest.raises(ValueError, match="context_lens"):
        checks.paged_values(cache, bt, torch.tensor([10**6], dtype=torch.int32))
