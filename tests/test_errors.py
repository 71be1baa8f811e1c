"""Bad input to every public op: rejected before any launch with TypeError / ValueError naming
the argument; or, for the data value checks once turned off, a defined result with no
out-of-bounds access (the kernels clamp / mask; the fp64 oracle defines what comes out).
"""
import os
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import inductor_dsa as idsa
from inductor_dsa import checks, formats, reference
from conftest import DEVICE
from attention_cases import assert_close, make
from paged_cases import assert_paged_topk, make_case, paged_oracle, to_device

T, H, D, K = 4, 2, 32, 6
PAGE = formats.PAGE_ROWS


def raises(exc, arg, what, fn):
    """fn() raises exactly ``exc``; its message names ``arg`` (as a word) and matches ``what``."""
    with pytest.raises(exc) as e:
        fn()
    assert type(e.value) is exc, f"{type(e.value).__name__} instead of {exc.__name__}: {e.value}"
    msg = str(e.value)
    assert re.search(rf"(?<![\w.]){re.escape(arg)}(?![\w(])", msg), f"{arg!r} not named in: {msg}"
    assert re.search(what, msg), f"{what!r} not in: {msg}"


# --- prefill indexer ------------------------------------------------------------------------------

def _ok():
    return torch.randn(T, H, D).bfloat16(), torch.randn(K, D).bfloat16(), torch.randn(T, H)


def _mx(x):
    return formats.mxfp4_encode(x.float())


INDEXER_BAD = [  # (mutate(q, k, w) -> (q, k, w), exception, argument named, message fragment)
    (lambda q, k, w: (q[0], k, w), ValueError, "q", r"\[\*, \*, D\]"),
    (lambda q, k, w: (q, k[0], w), ValueError, "k", r"\[\*, D\]"),
    (lambda q, k, w: (q, k[:, :16], w), ValueError, "k", "head_dim"),
    (lambda q, k, w: (q, k, w[:, :1]), ValueError, "weights", "shape"),
    (lambda q, k, w: (q, k, w[:3]), ValueError, "weights", "shape"),
    (lambda q, k, w: (q, k.half(), w), TypeError, "k", "share a dtype"),
    (lambda q, k, w: (q.int(), k, w), TypeError, "q", "bf16"),
    (lambda q, k, w: (q, k, w.int()), TypeError, "weights", "bf16"),
    (lambda q, k, w: (q, k, w.double()), TypeError, "weights", "bf16/fp16/fp32"),  # as the paged ops
    (lambda q, k, w: (q[..., :24], k[:, :24], w), ValueError, "q", "power of two"),
    (lambda q, k, w: (torch.randn(T, 257, 16).bfloat16(), k[:, :16], torch.randn(T, 257)), ValueError, "q",
     "heads"),
    (lambda q, k, w: ("q", k, w), TypeError, "q", "torch.Tensor"),
    (lambda q, k, w: (q, (k,), w), TypeError, "k", "pair"),
    (lambda q, k, w: (q, (k.view(torch.uint8), torch.zeros(K, 2, dtype=torch.uint8)), w), ValueError, "k[1]",
     "MXFP4 scales"),                                       # scale width: 2 scales for 32 elements
    (lambda q, k, w: (q, (_mx(k)[0], _mx(k)[1][:3]), w), ValueError, "k[1]", "shape"),
    (lambda q, k, w: (q, (k.view(torch.uint8)[:, :16], torch.zeros(K, 1)), w), TypeError, "k[1]", "E8M0"),
    (lambda q, k, w: (q, (k.float(), torch.ones(K)), w), TypeError, "k[0]", "uint8"),
    (lambda q, k, w: ((_mx(q)[0], _mx(q)[1].float()), k, w), TypeError, "q[1]", "E8M0"),
    (lambda q, k, w: (_mx(q)[0], k, w), TypeError, "q", "bf16"),       # MXFP4 codes without their scales
    (lambda q, k, w: (q, (k.float().to(torch.float8_e4m3fn), torch.ones(K + 1)), w), ValueError, "k[1]",
     "row scales"),
    (lambda q, k, w: (q, (k.float().to(torch.float8_e4m3fn), torch.ones(K).half()), w), TypeError, "k[1]",
     "row scales"),
    (lambda q, k, w: (q.float().to(torch.float8_e4m3fn), k, w), TypeError, "q", "FP8 pair"),
    (lambda q, k, w: (q.half(), _mx(k), w), TypeError, "q", "quantised k"),
    (lambda q, k, w: (_mx(q), k.half(), w), TypeError, "k", "MXFP4 q"),
    (lambda q, k, w: (q, k, w.to("meta")), ValueError, "weights", "on meta"),
    (lambda q, k, w: (q, k.to("meta"), w), ValueError, "k", "on meta"),
]


@pytest.mark.parametrize("mutate,exc,arg,what", INDEXER_BAD)
def test_indexer_bad_operands(mutate, exc, arg, what):
    q, k, w = mutate(*_ok())
    raises(exc, arg, what, lambda: idsa.indexer_logits(q, k, w))
    raises(exc, arg, what, lambda: idsa.indexer_topk(q, k, w, 2))


@pytest.mark.parametrize("topk,exc", [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError),
                                      (None, TypeError)])
def test_bad_topk(topk, exc):
    raises(exc, "topk", "", lambda: idsa.indexer_topk(*_ok(), topk))
    q, cache, w, bt, ctx = make_case(torch.Generator().manual_seed(0), d=32, ctx=[3, 70])
    raises(exc, "topk", "", lambda: idsa.paged_indexer_topk(q, cache, w, bt, ctx, topk))
    raises(exc, "topk", "", lambda: idsa.logits_topk(torch.randn(T, K), topk))


I32 = dict(dtype=torch.int32)


@pytest.mark.parametrize("ks,ke,exc,arg,what", [
    (torch.zeros(T, **I32), None, ValueError, "k_start", "both"),
    (None, torch.zeros(T, **I32), ValueError, "k_end", "both"),
    (torch.zeros(T), torch.ones(T), TypeError, "k_start", "integer"),
    (torch.zeros(T, **I32), torch.ones(T, dtype=torch.bool), TypeError, "k_end", "integer"),
    (torch.zeros(T + 1, **I32), torch.ones(T + 1, **I32), ValueError, "k_start", "shape"),
    (torch.zeros(T, **I32), torch.ones(T, 1, **I32), ValueError, "k_end", "shape"),
    (torch.zeros(T, device="meta", **I32), torch.ones(T, **I32), ValueError, "k_start", "is on"),
    ([0] * T, torch.ones(T, **I32), TypeError, "k_start", "torch.Tensor"),
])
def test_bad_ranges(ks, ke, exc, arg, what):
    raises(exc, arg, what, lambda: idsa.indexer_logits(*_ok(), k_start=ks, k_end=ke))
    raises(exc, arg, what, lambda: idsa.indexer_topk(*_ok(), 3, k_start=ks, k_end=ke))
    raises(exc, arg, what, lambda: idsa.logits_topk(torch.randn(T, K), 3, k_start=ks, k_end=ke))


@pytest.mark.parametrize("logits,exc,what", [
    ([[0.0] * K] * T, TypeError, "torch.Tensor"),
    (torch.randn(T, K, 1), ValueError, r"\[T, K\]"),
    (torch.randn(T, K, dtype=torch.float64), TypeError, "float32"),
    (torch.randn(T, K).bfloat16(), TypeError, "float32"),
])
def test_logits_topk_bad_logits(logits, exc, what):
    raises(exc, "logits", what, lambda: idsa.logits_topk(logits, 3))


def test_int64_ranges_accepted():
    q, k, w = _ok()
    out = idsa.indexer_logits(q, k, w, k_start=torch.zeros(T, dtype=torch.int64), k_end=torch.full((T,), 3))
    assert torch.isfinite(out[:, :3]).all() and (out[:, 3:] == float("-inf")).all()


# --- paged (decode) indexer -----------------------------------------------------------------------

def _paged():
    """(q, kv_cache, weights, block_table, context_lens): B=2, N=2, H=8, D=32 MXFP4 (17 B rows), 3 pages each."""
    return make_case(torch.Generator().manual_seed(1), d=32, ctx=[70, 130])


def _g(case):
    """paged_gather's operands (kv_cache, block_table, context_lens) of a paged case."""
    return case[1], case[3], case[4]


def _set(i, v):
    return lambda case: case[:i] + (v(case[i]) if callable(v) else v,) + case[i + 1:]


def _entry(r, p, v):
    def f(bt):
        bt = bt.clone()
        bt[r, p] = v
        return bt
    return f


# (mutate(case) -> case, exception, argument named, fragment); kw: fmt / fp8_flavor
PAGED_BAD = [
    (_set(1, lambda c: c.view(torch.int8)), TypeError, "kv_cache", "uint8"),
    (_set(1, lambda c: c[:, :-PAGE]), ValueError, "kv_cache", r"\(16 \+ 1 B per row\)"),   # row size != fmt
    (_set(1, lambda c: c.reshape(c.shape[0], PAGE, -1)), ValueError, "kv_cache", "num_pages"),
    (_set(1, lambda c: c.t().contiguous().t()), ValueError, "kv_cache", "contiguous"),
    (_set(1, lambda c: c.to("meta")), ValueError, "kv_cache", "on meta"),
    (_set(3, lambda b: b.long()), TypeError, "block_table", "int32"),
    (_set(3, lambda b: b.float()), TypeError, "block_table", "int32"),
    (_set(3, lambda b: b[0]), ValueError, "block_table", "max_pages"),
    (_set(3, lambda b: b[:1]), ValueError, "block_table", "batch"),
    (_set(4, lambda c: c.long()), TypeError, "context_lens", "int32"),
    (_set(4, lambda c: c.float()), TypeError, "context_lens", "int32"),
    (_set(4, lambda c: c[:1]), ValueError, "context_lens", "shape"),
    (_set(4, lambda c: c.view(2, 1)), ValueError, "context_lens", "shape"),
    (_set(4, lambda c: c.to("meta")), ValueError, "context_lens", "on meta"),
    (_set(0, lambda q: q.double()), TypeError, "q", "bf16/fp16/fp32"),
    (_set(0, lambda q: q.float().to(torch.float8_e4m3fn)), TypeError, "q", "bf16/fp16/fp32"),
    (_set(0, lambda q: q[0]), ValueError, "q", r"\[\*, \*, \*, D\]"),
    (_set(0, lambda q: q[..., :24]), ValueError, "q", "power of two"),
    (_set(0, lambda q: q.repeat(1, 1, 1, 2)), ValueError, "kv_cache", "head_dim 64"),      # q D 64 vs 17 B rows
    (_set(0, lambda q: (_mx(q)[0], _mx(q)[1][..., :0])), ValueError, "q[1]", "MXFP4 scales"),
    (_set(0, lambda q: q.to("meta")), ValueError, "q", "on meta"),
    (_set(2, lambda w: w[:, :1]), ValueError, "weights", "shape"),
    (_set(2, lambda w: w.int()), TypeError, "weights", "bf16"),
    (_set(2, lambda w: w.to(torch.float64)), TypeError, "weights", "bf16"),
    (_set(2, "w"), TypeError, "weights", "torch.Tensor"),
]


def _paged_calls(case, **kw):
    return [lambda: idsa.paged_indexer_logits(*case, **kw), lambda: idsa.paged_indexer_topk(*case, 5, **kw)]


@pytest.mark.parametrize("mutate,exc,arg,what", PAGED_BAD)
def test_paged_bad_operands(mutate, exc, arg, what):
    """Each bad operand is named, also right after the valid signature passed (``checks.paged`` is
    memoised per signature: a cache of another stride, dtype, shape or device is not a hit)."""
    case = _paged()
    checks.paged(case[0], None, *case[1:], "mxfp4", "fn")
    for call in _paged_calls(mutate(case)):
        raises(exc, arg, what, call)


@pytest.mark.parametrize("kw,exc,arg,what", [
    (dict(fmt="fp4"), ValueError, "fmt", "mxfp4"),
    (dict(fmt=None), ValueError, "fmt", "mxfp4"),
    (dict(fp8_flavor="e5m2"), ValueError, "fp8_flavor", "fnuz"),
    (dict(fmt="fp8"), ValueError, "kv_cache", "fmt='fp8'"),               # 17 B mxfp4 rows, read as fp8
])
def test_paged_bad_format(kw, exc, arg, what):
    case = _paged()
    for call in _paged_calls(case, **kw):
        raises(exc, arg, what, call)
    raises(exc, arg, what, lambda: idsa.paged_gather(*_g(case), **kw))


GATHER_BAD = [m for m in PAGED_BAD if m[2] in ("kv_cache", "context_lens") and "B per row" not in m[3]
              and "head_dim" not in m[3]] + [
    m for m in PAGED_BAD if m[2] == "block_table" and m[3] != "batch"] + [
    (_set(1, lambda c: c[:, :-PAGE]), ValueError, "kv_cache", "row size 1024 / 64 B"),   # D from the row: none
    (_set(4, lambda c: c[:1]), ValueError, "context_lens", r"\(2,\) = \[B\] of block_table"),
]


@pytest.mark.parametrize("mutate,exc,arg,what", GATHER_BAD)
def test_paged_gather_bad_operands(mutate, exc, arg, what):
    case = mutate(_paged())
    raises(exc, arg, what, lambda: idsa.paged_gather(*_g(case), total_rows=8))
    raises(exc, arg, what, lambda: idsa.paged_gather(*_g(case)))


def test_paged_gather_bad_total_rows():
    case = _paged()
    for n in (-1, 2.0, True):
        raises(ValueError, "total_rows", "non-negative int", lambda: idsa.paged_gather(*_g(case), total_rows=n))


# value checks: they read the data; on by default
PAGED_VALUES = [
    (_set(4, torch.tensor([70, -1], **I32)), "context_lens", r"\[0, 192\].*\[-1, 70\]"),
    (_set(4, torch.tensor([193, 5], **I32)), "context_lens", r"\[0, 192\].*\[5, 193\]"),
    (_set(3, _entry(1, 2, 99)), "block_table", r"block_table\[1, 2\] = 99 .*\[0, 7\)"),
    (_set(3, _entry(0, 1, -1)), "block_table", r"block_table\[0, 1\] = -1 "),
    (_set(3, _entry(1, 0, 2**31 - 1)), "block_table", "outside"),
]


@pytest.mark.parametrize("mutate,arg,what", PAGED_VALUES)
def test_paged_value_checks(mutate, arg, what):
    case = mutate(_paged())
    for call in _paged_calls(case) + [lambda: idsa.paged_gather(*_g(case)),
                                     lambda: idsa.paged_gather(*_g(case), total_rows=300)]:
        raises(ValueError, arg, what, call)
    idsa.paged_indexer_logits(*case, check_values=False)               # turned off: a defined result
    with checks.values(False):
        idsa.paged_indexer_topk(*case, 5)
        idsa.paged_gather(*_g(case))
        raises(ValueError, arg, what, _paged_calls(case, check_values=True)[1])  # the keyword wins


def test_value_checks_env_switch(monkeypatch):
    case = _set(4, torch.tensor([70, 999], **I32))(_paged())
    monkeypatch.setenv(checks.VALUES_ENV, "0")
    assert not checks.values_enabled()
    idsa.paged_indexer_topk(*case, 5)
    idsa.sparse_attention(*_sparse(bad=True)[:3])
    with checks.values(True):
        raises(ValueError, "context_lens", "999", lambda: idsa.paged_indexer_topk(*case, 5))
    monkeypatch.setenv(checks.VALUES_ENV, "1")
    raises(ValueError, "context_lens", "999", lambda: idsa.paged_indexer_topk(*case, 5))
    monkeypatch.delenv(checks.VALUES_ENV)
    assert checks.values_enabled()


def test_block_table_garbage_past_the_context_is_accepted():
    q, cache, w, bt, ctx = make_case(torch.Generator().manual_seed(1), n=1, h=4, d=32, ctx=[70, 100])
    assert bt[0, 2] == -1 and bt[1, 2] == -1  # ctx 70, 100 of 192: one unused entry per request
    bt[0, 2], bt[1, 2] = 2**31 - 1, -(2**31)
    vals, idx = idsa.paged_indexer_topk(*to_device((q, cache, w, bt, ctx)), 80)
    assert_paged_topk(vals, idx, paged_oracle((q, cache, w, bt, ctx), "mxfp4", "fn"), 80)


def test_value_checks_skipped_on_fake_tensors():
    real = _set(4, torch.tensor([-5, 10**6], **I32))(_paged()) + _sparse(bad=True)[:3]
    with FakeTensorMode() as mode:
        fq, fc, fw, fb, fx, sq, skv, sidx = (mode.from_tensor(x) for x in real)
        vals, idx = idsa.paged_indexer_topk(fq, fc, fw, fb, fx, 7)
        assert idx.shape == (2, 2, 7) and idx.dtype == torch.int32
        out = idsa.sparse_attention(sq, skv, sidx)
        assert out.shape == sq.shape
        raises(TypeError, "block_table", "int32", lambda: idsa.paged_indexer_topk(fq, fc, fw, fb.long(), fx, 7))


def test_value_checks_skipped_under_compile():
    """Under torch.compile the value checks are not traced (no sync, no graph break): garbage gets
    the kernels' defined result, the same as eager with the checks off."""
    case = _set(4, torch.tensor([-5, 10**6], **I32))(_paged())
    sq, skv, sidx, _ = _sparse(bad=True)

    def f(q, cache, w, bt, ctx, sq, skv, sidx):
        return idsa.paged_indexer_topk(q, cache, w, bt, ctx, 9), idsa.sparse_attention(sq, skv, sidx)

    torch._dynamo.reset()
    (vals, idx), out = torch.compile(f, backend="eager", fullgraph=True)(*case, sq, skv, sidx)
    with checks.values(False):
        (want_v, want_i), want_out = f(*case, sq, skv, sidx)
    assert torch.equal(idx, want_i)
    for got, want in ((vals, want_v), (out, want_out)):  # exact; NaN (garbage scale bytes) equals NaN
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


# --- sparse attention -----------------------------------------------------------------------------

def _sparse(bad=False):
    """(q [1, 2, 3, 16], kv [1, 10, 16], indices [1, 2, 5], sink [3]); ``bad``: indices 10 and -2 in it."""
    q, kv, idx, s = make(1, 2, 3, 16, 10, 5, seed=5, sink=True)
    if bad:
        idx = idx.clone()
        idx[0, 0, 1], idx[0, 1, 4] = 10, -2
    return q, kv, idx, s


SPARSE_BAD = [  # (mutate(q, kv, idx, sink, scale) -> same, exception, argument, fragment)
    (lambda q, kv, i, s, c: (q[0], kv, i, s, c), ValueError, "q", r"\[B, M, H, D\]"),
    (lambda q, kv, i, s, c: (q.int(), kv, i, s, c), TypeError, "q", "bf16"),
    (lambda q, kv, i, s, c: (q[..., :12], kv[..., :12], i, s, c), ValueError, "q", "power of two"),
    (lambda q, kv, i, s, c: (q, kv[0], i, s, c), ValueError, "kv", r"\[B, N, D\]"),
    (lambda q, kv, i, s, c: (q, kv.half(), i, s, c), TypeError, "kv", "dtype"),
    (lambda q, kv, i, s, c: (q, kv.repeat(2, 1, 1), i, s, c), ValueError, "kv", "B=1"),
    (lambda q, kv, i, s, c: (q, kv[..., :8], i, s, c), ValueError, "kv", "D=16"),
    (lambda q, kv, i, s, c: (q, kv, i.float(), s, c), TypeError, "indices", "int32 or int64"),
    (lambda q, kv, i, s, c: (q, kv, i.short(), s, c), TypeError, "indices", "int32 or int64"),
    (lambda q, kv, i, s, c: (q, kv, i[0], s, c), ValueError, "indices", r"\[B, M, topk\]"),
    (lambda q, kv, i, s, c: (q, kv, i[:, :1], s, c), ValueError, "indices", "M=2"),
    (lambda q, kv, i, s, c: (q, kv, i[..., :0], s, c), ValueError, "indices", "topk >= 1"),
    (lambda q, kv, i, s, c: (q, kv, i.tolist(), s, c), TypeError, "indices", "torch.Tensor"),
    (lambda q, kv, i, s, c: (q, kv, i, s[:2], c), ValueError, "sink", "shape"),
    (lambda q, kv, i, s, c: (q, kv, i, s.int(), c), TypeError, "sink", "float"),
    (lambda q, kv, i, s, c: (q, kv, i, s, "0.1"), TypeError, "scale", "float"),
    (lambda q, kv, i, s, c: (q, kv, i, s, float("inf")), ValueError, "scale", "finite"),
    (lambda q, kv, i, s, c: (q, kv, i, s, float("nan")), ValueError, "scale", "finite"),
    (lambda q, kv, i, s, c: (q, kv.to("meta"), i, s, c), ValueError, "kv", "on meta"),
    (lambda q, kv, i, s, c: (q, kv, i.to("meta"), s, c), ValueError, "indices", "on meta"),
]


@pytest.mark.parametrize("mutate,exc,arg,what", SPARSE_BAD)
def test_sparse_attention_bad_operands(mutate, exc, arg, what):
    q, kv, idx, s, c = mutate(*_sparse(), None)
    raises(exc, arg, what, lambda: idsa.sparse_attention(q, kv, idx, sink=s, scale=c))


@pytest.mark.parametrize("slot,value,what", [((0, 0, 1), 10, r"\[-1, 10\).*\[-?\d+, 10\]"),
                                             ((0, 1, 4), -2, r"\[-1, 10\).*\[-2, "),
                                             ((0, 0, 0), 2**31 - 1, "2147483647")])
def test_sparse_attention_index_values(slot, value, what):
    q, kv, idx, s = _sparse()
    for dtype in (torch.int32, torch.int64):
        bad = idx.to(dtype).clone()
        bad[slot] = value
        raises(ValueError, "indices", what, lambda: idsa.sparse_attention(q, kv, bad, sink=s))
        with checks.values(False):
            idsa.sparse_attention(q, kv, bad, sink=s)


# --- unchecked garbage: defined results, no out-of-bounds access (kernels clamp / mask) ------------

@pytest.mark.parametrize("split", ["nosplit", "split64"], indirect=True)
def test_paged_unchecked_garbage_matches_oracle(split):
    """Checks off; page ids past the cache and negative inside the context (read as zero rows),
    context_lens negative, 0, past capacity (clamped to [0, max_pages * 64]): logits, top-k and
    gather equal the oracle's defined result."""
    gen = torch.Generator().manual_seed(11)
    q, cache, w, bt, ctx = make_case(gen, n=1, h=4, d=32, ctx=[130, 60, 0, 190, 100], max_pages=3, shared=False)
    bt[0, 1] = cache.shape[0]                  # rows 64..127 of request 0: one past the last page
    bt[3, 0], bt[3, 2] = -1, 2**31 - 1         # request 3: first and last pages garbage
    ctx[1], ctx[4] = -7, 10**9                 # negative; past capacity (-> 192, every page used)
    bt[4] = torch.tensor([int(bt[3, 1]), -(2**31), cache.shape[0] + 1])
    case = (q, cache, w, bt, ctx)
    ref = paged_oracle(case, "mxfp4", "fn")
    assert (ref[0, :, 64:128] == 0).all() and (ref[3, :, :64] == 0).all() and torch.isinf(ref[1]).all()
    with checks.values(False):
        logits = idsa.paged_indexer_logits(*to_device(case)).cpu()
        vals, idx = idsa.paged_indexer_topk(*to_device(case), 40)
        (a, s), ks, ke = idsa.paged_gather(*to_device(_g(case)), total_rows=700)
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(logits), fin)
    assert (logits.double() - ref)[fin].abs().max() <= 1e-5 * ref[fin].abs().max()
    assert_paged_topk(vals, idx, ref, 40)
    want_a, want_s, want_ks, want_ke = reference.paged_gather(cache, bt, ctx, "mxfp4", 32, 700)
    assert torch.equal(ks.cpu(), want_ks) and torch.equal(ke.cpu(), want_ke) and int(want_ke[-1]) == 130 + 190 + 192
    assert torch.equal(a.cpu(), want_a) and torch.equal(s.cpu(), want_s)


def test_paged_all_zero_context_lens():
    case = _set(4, torch.zeros(2, **I32))(_paged())
    logits = idsa.paged_indexer_logits(*to_device(case))
    vals, idx = idsa.paged_indexer_topk(*to_device(case), 7)
    (a, s), ks, ke = idsa.paged_gather(*to_device(_g(case)), total_rows=0)
    assert (logits == float("-inf")).all() and (idx == -1).all() and (vals == float("-inf")).all()
    assert a.shape == (0, 16) and (ks == 0).all() and (ke == 0).all()


@pytest.mark.parametrize("split", ["split64"], indirect=True)
def test_paged_topk_batch_too_large_for_int32_histograms(split):
    """2**20 token rows (B = 2**19, N = 2) of a split top-k: the histogram offsets would pass 2**31
    words; a clear error, raised before any launch, instead of a wrong result."""
    b, pages = 2**19, 3
    q = torch.zeros(b, 2, 1, 32, dtype=torch.bfloat16, device=DEVICE)
    cache = torch.zeros(pages, formats.PAGE_ROWS * sum(formats.row_bytes("mxfp4", 32)), dtype=torch.uint8,
                        device=DEVICE)
    w = torch.ones(b, 2, 1, device=DEVICE)
    bt = torch.zeros(b, pages, dtype=torch.int32, device=DEVICE)
    ctx = torch.full((b,), 150, dtype=torch.int32, device=DEVICE)
    with checks.values(False):
        raises(ValueError, "paged_indexer_topk", "too large for one call",
               lambda: idsa.paged_indexer_topk(q, cache, w, bt, ctx, 5))


def test_sparse_attention_unchecked_garbage():
    """Checks off: indices >= N, < -1, huge (int64 too) are treated as -1; all-garbage rows give 0."""
    q, kv, idx, s = _sparse()
    bad = idx.long().clone()
    bad[0, 0] = torch.tensor([10, 2**40, -2, -(2**40), 3])
    bad[0, 1] = torch.tensor([11, -5, 2**31, 10**12, -3])      # all garbage
    with checks.values(False):
        out, lse = idsa.sparse_attention(q, kv, bad, sink=s, return_lse=True)
    assert_close(q, kv, torch.where((bad >= 0) & (bad < 10), bad, -1), s, out, lse)
    assert (out[0, 1] == 0).all() and torch.isneginf(lse[0, 1]).all()


def test_indexer_ranges_outside_are_clamped():
    """k_start / k_end are not value-checked: outside [0, K] they are clamped, inverted is empty."""
    q, k, w = _ok()
    ks = torch.tensor([-10**9, 2, 5, 7], dtype=torch.int64)
    ke = torch.tensor([3, 10**12, 1, 10**9])
    logits = idsa.indexer_logits(q, k, w, k_start=ks, k_end=ke)
    vals, idx = idsa.indexer_topk(q, k, w, K + 2, k_start=ks, k_end=ke)
    ref = reference.indexer_logits(q, k, w, ks.clamp(0, K), ke.clamp(0, K))
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(logits), fin) and (logits.double() - ref)[fin].abs().max() <= 1e-5
    assert (idx[2:] == -1).all() and (idx[0, :3] >= 0).all() and (idx[0, 3:] == -1).all()
    assert sorted(idx[1, :4].tolist()) == [2, 3, 4, 5] and (idx[1, 4:] == -1).all()


def test_checks_run_before_any_launch(monkeypatch):
    """A rejected call launches nothing: the launchers are replaced by a tripwire."""
    from inductor_dsa.kernels import attention_launch, indexer_launch, paged_launch

    def boom(*a, **k):
        raise AssertionError("launched")
    for mod, names in ((indexer_launch, ("indexer_logits", "indexer_topk")), (attention_launch, ("sparse_attention",)),
                       (paged_launch, ("paged_logits", "paged_topk", "paged_gather"))):
        for n in names:
            monkeypatch.setattr(mod, n, boom)
    q, k, w = _ok()
    raises(ValueError, "weights", "shape", lambda: idsa.indexer_topk(q, k, w[:1], 2))
    raises(ValueError, "context_lens", "193", lambda: idsa.paged_indexer_topk(
        *_set(4, torch.tensor([1, 193], **I32))(_paged()), 3))
    raises(ValueError, "indices", "10", lambda: idsa.sparse_attention(*_sparse(bad=True)[:3]))
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        with pytest.raises(AssertionError, match="launched"):   # the tripwire is live
            idsa.indexer_topk(q, k, w, 2)


def test_paged_nan_key_ranks_last():
    """An E8M0 scale byte 0xFF (NaN) in a visible cache row makes that row's score NaN (as in the
    oracle): it ranks below every real score and, when selected, reports -inf."""
    q, cache, w, bt, ctx = make_case(torch.Generator().manual_seed(2), n=1, h=2, d=32, ctx=[20])
    cache[int(bt[0, 0]), PAGE * 16 + 5] = 0xFF                 # scale byte of row 5 (mxfp4 D=32: 16 + 1 B rows)
    ref = paged_oracle((q, cache, w, bt, ctx), "mxfp4", "fn")
    assert ref[0, 0, 5].isnan() and torch.isfinite(ref[0, 0, :20][torch.arange(20) != 5]).all()
    vals, idx = (t.cpu() for t in idsa.paged_indexer_topk(*to_device((q, cache, w, bt, ctx)), 20))
    assert idx[0, 0, -1] == 5 and vals[0, 0, -1] == float("-inf")
    vals, idx = (t.cpu() for t in idsa.paged_indexer_topk(*to_device((q, cache, w, bt, ctx)), 12))
    assert not (idx == 5).any()
    assert_paged_topk(vals, idx, ref, 12)


def test_paged_check_kernel_counts(gen):
    """The value check's counting kernel against a per-row Python count: contexts negative, past
    capacity, exact page multiples, over several kernel steps; a non-contiguous block table."""
    from inductor_dsa.kernels.paged_launch import CHECK_PAGES, paged_check
    num_pages, max_pages = 50, 2 * CHECK_PAGES + 37
    max_len = max_pages * PAGE
    ctx = torch.tensor([-3, 0, 1, 64, max_len, max_len + 1, CHECK_PAGES * PAGE + 1, 2**31 - 1], **I32)
    full = torch.randint(-5, num_pages + 5, (max_pages, ctx.shape[0]), generator=gen, dtype=torch.int32)
    bt = full.t()                                      # stride (1, B): not contiguous
    bt[6, :CHECK_PAGES + 2] = 3
    bt[6, CHECK_PAGES] = -1                            # row 6's only bad page: first of its second step
    cache = torch.zeros(num_pages, 64 * 68, dtype=torch.uint8)
    want_ctx = want_pages = 0
    for b, c in enumerate(ctx.tolist()):
        want_ctx += not 0 <= c <= max_len
        used = -(-min(max(c, 0), max_len) // PAGE)
        want_pages += sum(not 0 <= p < num_pages for p in bt[b, :used].tolist())
    assert want_ctx == 3 and want_pages > 0
    dev = to_device((cache, bt, ctx))
    assert paged_check(*dev) == (want_ctx, want_pages)
    ok = (cache, bt.clamp(0, num_pages - 1), ctx.clamp(0, max_len))
    assert paged_check(*to_device(ok)) == (0, 0)
    checks.paged_values(*to_device(ok))
