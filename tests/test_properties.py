"""Hypothesis property tests: every public op against the float64 oracle (inductor_dsa.reference).

Hypothesis draws shapes and parameters; tensor values come from a torch generator seeded with
a drawn integer (random normals, never all-zero). Example counts are small and derandomized
so the file stays fast under TRITON_INTERPRET=1 and runs the same examples every time
(``INDUCTOR_DSA_EXAMPLES`` scales them up for a longer, fresh run).
"""
import pytest
import torch
from hypothesis import given, strategies as st

import inductor_dsa as idsa
from inductor_dsa import checks, reference
from inductor_dsa.kernels import paged_launch
from conftest import DEVICE
from attention_cases import assert_close, make
from indexer_cases import assert_logits, assert_topk, logits_tol, quantised, to_device_each
from paged_cases import assert_paged_topk, make_case, to_device
from property_settings import examples

FEW = examples(6)
SOME = examples(10)

SIZES = st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31])     # 1 and primes
HEADS = st.sampled_from([1, 2, 3, 5])
SEEDS = st.integers(0, 2**31 - 1)
RANGES = st.sampled_from(["none", "full", "empty", "ragged", "inverted", "outside"])
KINDS = ["bf16", "fp32", "mxfp4 k", "mxfp4 q+k", "fp8 k fn", "fp8 q+k fn", "fp8 k fnuz", "fp8 q+k fnuz"]
EACH = examples(4)   # per parametrized kind


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _ranges(kind, t, n, g):
    """(k_start, k_end) int32 [T], or (None, None) for the op's default (whole of K)."""
    if kind == "none":
        return None, None
    if kind == "full":
        return reference.full_ranges(t, n)
    if kind == "empty":                       # k_start == k_end somewhere in [0, K]
        s = torch.randint(0, n + 1, (t,), generator=g, dtype=torch.int32)
        return s, s.clone()
    a = torch.randint(-3, n + 4, (t,), generator=g, dtype=torch.int32)
    b = torch.randint(-3, n + 4, (t,), generator=g, dtype=torch.int32)
    if kind == "inverted":                    # k_start > k_end (nothing visible) on every row
        return torch.maximum(a, b) + 1, torch.minimum(a, b)
    if kind == "outside":                     # both ends past [0, K] on some rows
        return torch.minimum(a, b) - n - 2, torch.maximum(a, b) + n + 2
    return torch.minimum(a, b), torch.maximum(a, b)  # ragged, partly outside [0, K]


def _indexer_case(seed, kind, t, n, h):
    """(q, k, w) with q/k of the given kind: plain bf16 / fp32, or MXFP4 / FP8 pairs."""
    g = _gen(seed)
    d = 32 if kind.startswith("mxfp4") else (16 if kind in ("bf16", "fp32") else 32)
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    q = torch.randn(t, h, d, generator=g).to(dtype)
    k = torch.randn(n, d, generator=g).to(dtype)
    w = torch.randn(t, h, generator=g).to(dtype)
    if kind not in ("bf16", "fp32"):
        q, k = quantised(kind, q, k, g)
    return q, k, w, g


def _call_ranges(ks, ke):
    return {} if ks is None else dict(k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))


@pytest.mark.parametrize("kind", KINDS)
@EACH
@given(seed=SEEDS, t=SIZES, n=SIZES, h=HEADS, rk=RANGES)
def test_indexer_logits_matches_oracle(seed, kind, t, n, h, rk):
    q, k, w, g = _indexer_case(seed, kind, t, n, h)
    ks, ke = _ranges(rk, t, n, g)
    out = idsa.indexer_logits(*to_device_each(q, k, w), **_call_ranges(ks, ke))
    assert out.dtype == torch.float32 and out.shape == (t, n)
    assert_logits(out, reference.indexer_logits(q, k, w, ks, ke), logits_tol(kind))


@pytest.mark.parametrize("kind", KINDS)
@EACH
@given(seed=SEEDS, t=SIZES, n=SIZES, h=HEADS, rk=RANGES, extra=st.integers(-30, 8))
def test_indexer_topk_matches_oracle(seed, kind, t, n, h, rk, extra):
    """Set-with-tolerance selection, oracle values at the chosen columns, descending order,
    -1 / -inf tails (topk may exceed the visible count and K itself)."""
    q, k, w, g = _indexer_case(seed, kind, t, n, h)
    ks, ke = _ranges(rk, t, n, g)
    topk = max(1, n + extra)
    vals, idx = idsa.indexer_topk(*to_device_each(q, k, w), topk, **_call_ranges(ks, ke))
    ref = reference.indexer_logits(q, k, w, ks, ke)
    assert_topk(vals, idx, ref, topk, logits_tol(kind))
    n_vis = torch.isfinite(ref).sum(1)
    assert ((idx.cpu() >= 0).sum(1) == n_vis.clamp(max=topk)).all()


@EACH
@given(seed=SEEDS, t=SIZES, n=SIZES, h=HEADS, rk=RANGES, topk=st.integers(1, 40))
def test_indexer_topk_deterministic(seed, t, n, h, rk, topk):
    q, k, w, g = _indexer_case(seed, "bf16", t, n, h)
    ks, ke = _ranges(rk, t, n, g)
    a = idsa.indexer_topk(*to_device_each(q, k, w), topk, **_call_ranges(ks, ke))
    b = idsa.indexer_topk(*to_device_each(q, k, w), topk, **_call_ranges(ks, ke))
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])


@FEW
@given(seed=SEEDS, t=st.sampled_from([2, 3, 5]), n=SIZES, h=HEADS, rk=RANGES, topk=st.integers(1, 16),
       where=st.sampled_from(["q", "k"]))
def test_indexer_topk_nan_matches_oracle(seed, t, n, h, rk, topk, where):
    """NaN in q (every score of that row NaN: relu keeps NaN) or in one key row (that column NaN):
    the oracle's ranking (NaN below every number, value -inf), no special case."""
    q, k, w, g = _indexer_case(seed, "bf16", t, n, h)
    if where == "q":
        q[int(torch.randint(0, t, (1,), generator=g)), 0, 0] = float("nan")
    else:
        k[int(torch.randint(0, n, (1,), generator=g)), 0] = float("nan")
    ks, ke = _ranges(rk, t, n, g)
    ref = reference.indexer_logits(q, k, w, ks, ke)
    assert_logits(idsa.indexer_logits(*to_device_each(q, k, w), **_call_ranges(ks, ke)), ref, 1e-5)
    assert_topk(*idsa.indexer_topk(*to_device_each(q, k, w), topk, **_call_ranges(ks, ke)), ref, topk)


@SOME
@given(seed=SEEDS, t=st.sampled_from([3, 5]), n=st.sampled_from([7, 13, 31]), rk=RANGES, extra=st.integers(-8, 4))
def test_logits_topk_special_values_exact(seed, t, n, rk, extra):
    """logits drawn from {NaN, -inf, +inf, -0.0, +0.0, 1, -1, random}: exactly the oracle's
    indices and values (NaN last reading -inf, +0.0 == -0.0, ties to the lower column)."""
    g = _gen(seed)
    pool = torch.tensor([float("nan"), float("-inf"), float("inf"), -0.0, 0.0, 1.0, -1.0])
    logits = pool[torch.randint(0, len(pool), (t, n), generator=g)]
    logits = torch.where(torch.rand(t, n, generator=g) < 0.2, torch.randn(t, n, generator=g), logits)
    ks, ke = _ranges(rk, t, n, g)
    topk = max(1, n + extra)
    vals, idx = idsa.logits_topk(logits.to(DEVICE), topk, **_call_ranges(ks, ke))
    if ks is None:
        ks, ke = reference.full_ranges(t, n)
    want_v, want_i = reference.logits_topk(logits, topk, ks, ke)
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)


PAGED_FMT = st.sampled_from([("mxfp4", "fn"), ("fp8", "fn"), ("fp8", "fnuz")])
CTX = st.sampled_from([0, 1, 2, 5, 63, 64, 65, 127, 150, 192, 193, 500, -4])   # max_pages=3: 192 rows


@FEW
@given(seed=SEEDS, fmt=PAGED_FMT, ctx=st.lists(CTX, min_size=1, max_size=4), n=st.sampled_from([1, 2]),
       h=HEADS, topk=st.sampled_from([1, 7, 64, 130, 250]), shared=st.booleans(), q_mxfp4=st.booleans(),
       ints=st.booleans(), one_wave=st.booleans())
def test_paged_indexer_topk_matches_oracle(seed, fmt, ctx, n, h, topk, shared, q_mxfp4, ints, one_wave):
    """Random page order, shared prefix pages, random bytes in unused rows and garbage block-table
    entries past the context, context_lens 0 / negative / past capacity (value checks off: clamped),
    topk > context; ``ints``: integer-valued q, keys and weights (many tied scores: crowded
    histogram bins, whose chunks keep their exact top-k); ``one_wave``: on the CPU every chunk in
    one wave of programs (the final merge's fine-histogram cut; ``paged_launch`` directly), else
    the public op (3 programs per wave on the CPU)."""
    fmt, flavor = fmt
    case = make_case(_gen(seed), fmt=fmt, flavor=flavor, n=n, h=h, d=32, ctx=ctx, shared=shared,
                     q_mxfp4=q_mxfp4, ints=ints)
    q, cache, w, bt, cl = case
    if one_wave:  # the launcher itself, with a wave of 256 programs
        qd, qs = (to_device(q[0]), to_device(q[1])) if isinstance(q, tuple) else (to_device(q), None)
        vals, idx = paged_launch.paged_topk(qd, qs, to_device(cache), to_device(w), to_device(bt), to_device(cl),
                                            topk, fmt, flavor, programs=256)
    else:
        with checks.values(False):
            vals, idx = idsa.paged_indexer_topk(to_device(q), to_device(cache), to_device(w), to_device(bt),
                                                to_device(cl), topk, fmt=fmt, fp8_flavor=flavor)
    ref = reference.paged_indexer_logits(q, cache, w, bt, cl, fmt, flavor)
    assert_paged_topk(vals, idx, ref, topk)
    live = cl.long().clamp(0, bt.shape[1] * 64).view(-1, 1)
    assert ((idx.cpu() >= 0).sum(-1) == live.clamp(max=topk)).all()
    with checks.values(False):
        a, b = idsa.paged_indexer_topk(to_device(q), to_device(cache), to_device(w), to_device(bt),
                                       to_device(cl), topk, fmt=fmt, fp8_flavor=flavor)
    assert torch.equal(idx, b) and torch.equal(vals, a)      # deterministic, bitwise


@SOME
@given(seed=SEEDS, b=st.sampled_from([1, 2]), m=st.sampled_from([1, 2, 3]), h=st.sampled_from([1, 3, 8]),
       d=st.sampled_from([16, 32]), n=SIZES, topk=st.sampled_from([1, 5, 17, 40]),
       holes=st.sampled_from([0.0, 0.3, 0.9, 1.0]), sink=st.booleans(), mask_one=st.booleans())
def test_sparse_attention_matches_oracle(seed, b, m, h, d, n, topk, holes, sink, mask_one):
    """-1 holes (none, some, most, all), an all-masked query, sink on / off: out and lse match
    the oracle; a query with no slot gets out = 0 and lse = -inf, never NaN."""
    q, kv, idx, s = make(b, m, h, d, n, topk, holes=holes, seed=seed, sink=sink)
    if mask_one:
        idx[-1, -1] = -1
    out, lse = idsa.sparse_attention(q, kv, idx, sink=s, return_lse=True)
    assert_close(q, kv, idx, s, out, lse)
    empty = (idx.cpu() < 0).all(-1)
    assert (out.cpu()[empty] == 0).all() and torch.isneginf(lse.cpu()[empty]).all()
