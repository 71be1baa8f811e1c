"""Paged (decode) indexer: logits, fused top-k, flat-buffer gather, against the float64 oracle.

Fresh random inputs per test (conftest's seeded generator). Caches are full of random bytes;
only the rows a request can see are real encodings, so reading any other row (past the context,
an unused page, a garbage block-table entry) shows up as NaN/garbage scores.
Run: TRITON_INTERPRET=1 python -m pytest tests/test_paged_indexer.py -q
"""
import dataclasses

import pytest
import torch
import triton
import triton.language as tl

import inductor_dsa as idsa
from inductor_dsa import checks, formats, reference
from inductor_dsa.kernels import configs, paged_launch
from inductor_dsa.kernels.paged_indexer import split_query
from conftest import DEVICE, misaligned_copy
from paged_cases import (SPLITS, assert_paged_topk, fp8_flavor_for, make_case, paged_oracle, run_paged_topk,
                         to_device)

PAGE = formats.PAGE_ROWS
TARGET = "interpreter" if DEVICE == "cpu" else None


@pytest.mark.parametrize("split", list(SPLITS), indirect=True)
@pytest.mark.parametrize("topk", [5, 40, 190])
def test_topk_nan_and_zero_ranking_exact(split, topk, gen):
    """Integer-valued q and keys (exact scores, many ties at 0 and elsewhere) and NaN rows (E8M0
    byte 0xFF): exactly the oracle's indices, on the single and the split paths (NaN candidates
    cross the partial lists and the final merge)."""
    case = make_case(gen, n=2, h=2, d=32, ctx=[190, 64, 130], ints=True)
    cache, bt = case[1], case[3]
    for p in bt[:, :2].flatten().unique().tolist():             # E8M0 bytes follow 64 x 16 code bytes
        if 0 <= p < cache.shape[0]:
            cache[p, PAGE * 16 + torch.randint(0, PAGE, (3,), generator=gen)] = 0xFF
    assert paged_oracle(case, "mxfp4", "fn").isnan().any()
    vals, idx = idsa.paged_indexer_topk(*to_device(case), topk, check_values=False)
    want_v, want_i = reference.paged_indexer_topk(*case, topk)
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)


@pytest.mark.parametrize("entries", [0, 8])
def test_ranked_rows_merge_when_their_lists_crowd(entries, gen, monkeypatch):
    """A few token rows skip the merge: ``list_rank_kernel`` ranks their packed list entries, or,
    past rank_entries x next_pow2(k) of them (a run of ties crowding every chunk's list; forced here
    with 0), its program 0 merges the lists as ``list_merge_kernel`` would. Integer scores (many
    ties); both exact."""
    target = configs.target_for(torch.device(DEVICE))
    cfg = dataclasses.replace(configs.PAGED[target], **SPLITS["split48-bn16"], rank_entries=entries)
    monkeypatch.setitem(configs.PAGED, target, cfg)
    case = make_case(gen, n=2, h=2, d=32, ctx=[190, 64, 130], ints=True)
    stats = {}
    q, cache, w, bt, ctx = to_device(case)
    vals, idx = paged_launch.paged_topk(q, None, cache, w, bt, ctx, 40, "mxfp4", "fn", stats=stats)
    assert stats["plan"].splits > 1 and q.shape[0] * q.shape[1] <= cfg.rank_rows
    want_v, want_i = reference.paged_indexer_topk(*case, 40)
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)


@pytest.mark.parametrize("split", list(SPLITS), indirect=True)
@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fn"), ("fp8", "fnuz")])
@pytest.mark.parametrize("programs", [None, 64], ids=["waves", "one-wave"])
def test_topk_matches_oracle(fmt, flavor, split, programs, gen):
    """``waves``: the interpreter's 3 programs per wave; ``one-wave``: every chunk in one wave, so
    the final merge copies only the candidates its fine histogram keeps."""
    case = make_case(gen, fmt=fmt, flavor=flavor)
    stats = {}
    q, cache, w, bt, ctx = to_device(case)
    vals, idx = paged_launch.paged_topk(q, None, cache, w, bt, ctx, 24, fmt, fp8_flavor_for(fmt, flavor),
                                        programs=programs, stats=stats)
    assert_paged_topk(vals, idx, paged_oracle(case, fmt, flavor), 24)
    assert (stats["plan"].splits > 1) == (split != "nosplit")
    if split != "nosplit":
        # the histogram threshold prunes: request 3 (190 rows) has S lists of 24 candidates;
        # far fewer than all of them survive to the final select
        cand = stats["candidates"].cpu().reshape(4, 2, -1).sum(-1)
        assert (cand[3] >= 24).all() and (cand[3] < 24 * stats["plan"].splits - 12).all(), cand
    assert (idx[0] == -1).all()  # context_len 0
    assert (idx[1, :, 1:] == -1).all() and (idx[1, :, 0] == 0).all()  # context_len 1


@pytest.mark.parametrize("split", ["split64"], indirect=True)
@pytest.mark.parametrize("programs,span", [(64, 1 << 17), (2, 1 << 17), (64, 64)], ids=["one-wave", "waves", "copies"])
def test_topk_crowded_threshold_bin_falls_back_exactly(split, programs, span, monkeypatch, gen):
    """Crowded histogram bins. Request 0: zero keys (score +0.0) but row 60 of each 64-row chunk
    (at most 3 positive scores: its k-th largest is a 0); request 2: zero weights (every score
    +0.0). Their threshold bin is 0's, so more of a chunk's rows pass it than its list holds, and
    each chunk keeps its exact top k instead (the first k in row order would miss a positive row
    60). Requests 1 and 3 stay random (lists pruned by the threshold). With 2 programs per wave the
    later waves' lists were cut by a histogram still missing chunks (a lower threshold: more
    candidates, same result); in one wave the final merge keeps only the candidates at or above
    the fine histogram's threshold. ``copies``: 4 histograms per row (a context row span of 64)."""
    target = configs.target_for(torch.device(DEVICE))
    monkeypatch.setitem(configs.PAGED, target, dataclasses.replace(configs.PAGED[target], hist_span=span))
    assert paged_launch.hist_copies(192, configs.PAGED[target]) == (4 if span == 64 else 1)
    topk = 5
    q, cache, w, bt, ctx = case = make_case(gen, ctx=[190, 150, 130, 120])
    code_bytes = formats.row_bytes("mxfp4", q.shape[-1])[0]
    for p in range(3):
        codes = cache[bt[0, p], : PAGE * code_bytes].view(PAGE, code_bytes)
        codes[:60] = 0
        codes[61:] = 0
    w[2] = 0.0
    stats = {}
    q, cache, w, bt, ctx = to_device(case)
    vals, idx = paged_launch.paged_topk(q, None, cache, w, bt, ctx, topk, "mxfp4", "fn", programs=programs,
                                        stats=stats)
    assert_paged_topk(vals, idx, paged_oracle(case, "mxfp4", "fn"), topk)
    assert (idx[2].cpu() == torch.arange(topk, dtype=torch.int32)).all() and (vals[2] == 0).all()
    cand = stats["candidates"].cpu().view(4, 2, -1)
    assert (cand[0] == topk).all() and (cand[2, :, :2] == topk).all(), cand  # their full chunks fell back
    assert (cand[1::2].sum(-1) < topk * 3).all(), cand  # random requests: pruned below S x k


@pytest.mark.parametrize("split", ["nosplit", "split64"], indirect=True)
def test_topk_chunks_scored_by_several_programs(split, monkeypatch, gen):
    """Few items, many programs: each chunk's rows are scored by several programs (``SplitPlan.sub``)
    writing one workspace slot; the result is the oracle's, with contexts ending inside a part."""
    target = configs.target_for(torch.device(DEVICE))
    cfg = configs.PAGED[target]
    monkeypatch.setitem(configs.PAGED, target, dataclasses.replace(cfg, score_min=cfg.bn))
    case = make_case(gen, ctx=[0, 33, 150, 250], max_pages=4)
    stats = {}
    q, cache, w, bt, ctx = to_device(case)
    vals, idx = paged_launch.paged_topk(q, None, cache, w, bt, ctx, 24, "mxfp4", "fn", programs=64, stats=stats)
    assert stats["plan"].sub > 1 and (stats["plan"].splits > 1) == (split != "nosplit")
    assert_paged_topk(vals, idx, paged_oracle(case, "mxfp4", "fn"), 24)


@pytest.mark.parametrize("split", ["nosplit", "split64"], indirect=True)
def test_topk_larger_than_context(split, gen):
    # topk 200 > contexts 0, 37, 70 and > max_len 192 (value checks off: context_lens 250 is clamped to 192)
    case = make_case(gen, ctx=[0, 37, 250, 70])
    with checks.values(False):
        vals, idx = run_paged_topk(case, 200, "mxfp4", "fn")
    assert_paged_topk(vals, idx, paged_oracle(case, "mxfp4", "fn"), 200)
    assert (idx[1, :, 37:] == -1).all() and (idx[2, :, 192:] == -1).all() and (idx[3, :, 70:] == -1).all()
    assert (idx[2, :, :192] >= 0).all()


@pytest.mark.parametrize("split", ["nosplit", "split64"], indirect=True)
@pytest.mark.parametrize("n,h", [(1, 8), (3, 16)])
def test_topk_tokens_and_groups(n, h, split, gen):
    # N=3, H=16: 16 query rows per program under the interpreter -> 3 token groups
    case = make_case(gen, n=n, h=h, d=32, ctx=[5, 129, 150])
    vals, idx = run_paged_topk(case, 16, "mxfp4", "fn")
    assert_paged_topk(vals, idx, paged_oracle(case, "mxfp4", "fn"), 16)


@pytest.mark.parametrize("split", ["split64"], indirect=True)
@pytest.mark.parametrize("fmt", ["mxfp4", "fp8"])
def test_topk_mxfp4_query(fmt, split, gen):
    case = make_case(gen, fmt=fmt, q_mxfp4=True, ctx=[3, 100, 170])
    vals, idx = run_paged_topk(case, 20, fmt, "fn")
    assert_paged_topk(vals, idx, paged_oracle(case, fmt, "fn"), 20)


def _full_precision_q(case, dtype, gen):
    """``case`` with a fresh q of ``dtype`` using its whole significand (not bf16-exact: a q rounded
    to bf16 misses the 1e-5 tolerance), a wide exponent spread, an inf (request 3, token 0, head 0)
    and a NaN (request 3, token 1, head 1)."""
    q = case[0]
    x = torch.randn(q.shape, generator=gen, dtype=torch.float64) * torch.exp2(
        torch.randint(-6, 7, q.shape[:-1] + (1,), generator=gen).double())
    x = x.to(dtype)
    x[3, 0, 0, 5], x[3, 1, 1, 2] = float("inf"), float("nan")
    assert not torch.equal(x.bfloat16().to(dtype), x)
    return (x,) + case[1:]


@triton.jit
def _split_kernel(x, parts, Q_PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """parts[i] = split_query(x)[i] (fp32), mid 0 (left unwritten) when Q_PARTS == 2."""
    o = tl.arange(0, BLOCK)
    hi, mid, lo = split_query(tl.load(x + o), Q_PARTS, tl.float32)
    tl.store(parts + o, hi)
    if Q_PARTS == 3:
        tl.store(parts + BLOCK + o, mid)
    tl.store(parts + 2 * BLOCK + o, lo)


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_split_query_parts_are_exact(q_dtype, gen):
    """hi + mid + lo == q exactly (fp64 sum), each part bf16-exact; inf keeps parts 0, NaN stays NaN."""
    info = torch.finfo(q_dtype)
    x = torch.randn(1024, generator=gen, dtype=torch.float64) * torch.exp2(torch.randint(-30, 31, (1024,), generator=gen))
    edge = [info.max, -info.max, info.tiny, info.eps, 1 + info.eps, -(2 - info.eps), 0.0, -0.0,
            float("inf"), float("-inf"), float("nan")]
    x = torch.cat([torch.tensor(edge, dtype=torch.float64), x])[:1024].to(q_dtype)
    parts = torch.zeros(3, 1024, dtype=torch.float32, device=DEVICE)
    _split_kernel[(1,)](x.float().to(DEVICE), parts, Q_PARTS=paged_launch.Q_PARTS[q_dtype], BLOCK=1024)
    parts = parts.cpu()
    num = ~parts.isnan()
    assert torch.equal(parts[num].bfloat16().float(), parts[num])
    fin = torch.isfinite(x)
    assert torch.equal(parts.double().sum(0)[fin], x.double()[fin])
    assert torch.equal(parts[0][~fin].isinf(), x[~fin].isinf()) and (parts[1:, x.isinf()] == 0).all()
    assert parts[:, x.isnan()].isnan().any(0).all()


@pytest.mark.parametrize("split", ["nosplit", "split64"], indirect=True)
@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fn"), ("fp8", "fnuz")])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_topk_fp32_fp16_query(q_dtype, fmt, flavor, split, gen):
    """fp32 / fp16 q: fp32-accurate products (bf16 parts of q, exact bf16 keys), odd contexts."""
    case = _full_precision_q(make_case(gen, fmt=fmt, flavor=flavor, ctx=[0, 37, 129, 191]), q_dtype, gen)
    vals, idx = run_paged_topk(case, 24, fmt, flavor)
    ref = paged_oracle(case, fmt, flavor)
    assert ref[3, 1, :191].isnan().all() and ref[3, 0, :191].isinf().any()  # NaN poisons its token's row
    assert_paged_topk(vals, idx, ref, 24)


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fnuz")])
def test_logits_fp32_fp16_query(q_dtype, fmt, flavor, gen):
    case = _full_precision_q(make_case(gen, fmt=fmt, flavor=flavor, n=3, h=5, ctx=[1, 64, 77, 150]), q_dtype, gen)
    out = idsa.paged_indexer_logits(*to_device(case), fmt=fmt, fp8_flavor=flavor).cpu()
    ref = paged_oracle(case, fmt, flavor)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isneginf(), ref.isneginf())
    assert torch.equal(out.isposinf(), ref.isposinf())
    fin = torch.isfinite(ref)
    assert (out.double() - ref)[fin].abs().max() <= 1e-5 * ref[fin].abs().max()


@pytest.mark.parametrize("split", ["nosplit", "split64"], indirect=True)
@pytest.mark.parametrize("zero_w", [False, True])
def test_topk_ties_exact(zero_w, split, gen):
    # small integers: exact scores, many ties; zero weights make every score 0 (all one bin):
    # the result must equal the stable descending sort (lowest rows first) exactly
    case = make_case(gen, ctx=[0, 65, 150, 190], ints=True)
    if zero_w:
        case = case[:2] + (torch.zeros_like(case[2]),) + case[3:]
    vals, idx = run_paged_topk(case, 30, "mxfp4", "fn")
    want_v, want_i = reference.paged_indexer_topk(*case, 30)
    assert torch.equal(idx.cpu(), want_i) and torch.equal(vals.cpu(), want_v)


@pytest.mark.parametrize("split", ["split64"], indirect=True)
def test_out_of_range_page_reads_as_zero_row(split, gen):
    q, cache, w, bt, ctx = make_case(gen, ctx=[70, 130, 0, 10], shared=False)
    bt[0, 1] = cache.shape[0] + 7  # inside the context of request 0 (rows 64..69)
    bt[1, 0] = -3                  # rows 0..63 of request 1
    case = (q, cache, w, bt, ctx)
    ref = paged_oracle(case, "mxfp4", "fn")
    assert (ref[0, :, 64:70] == 0).all() and (ref[1, :, :64] == 0).all()
    vals, idx = run_paged_topk(case, 80, "mxfp4", "fn", check_values=False)
    assert_paged_topk(vals, idx, ref, 80)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\]"):   # value checks are on by default
        idsa.paged_indexer_topk(*to_device(case), 8)
    bad_ctx = ctx.clone()
    bad_ctx[3] = 3 * PAGE + 1
    with pytest.raises(ValueError, match="context_lens"):
        idsa.paged_indexer_logits(*to_device((q, cache, w, bt, bad_ctx)), check_values=True)


@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fnuz")])
def test_logits_match_oracle(fmt, flavor, gen):
    # value checks off: context_lens past max_len (250 > 192) is clamped; -1 is clamped to 0
    case = make_case(gen, fmt=fmt, flavor=flavor, ctx=[-1, 250, 1, 77])
    q, cache, w, bt, ctx = case
    out = idsa.paged_indexer_logits(*to_device(case), fmt=fmt, fp8_flavor=flavor, check_values=False).cpu()
    ref = paged_oracle(case, fmt, flavor)
    assert out.shape == (4, 2, 3 * PAGE) and out.dtype == torch.float32
    fin = torch.isfinite(ref)
    assert fin.sum() == 2 * (1 + 77 + 192)
    assert torch.equal(torch.isfinite(out), fin) and (out[~fin] == float("-inf")).all()
    assert (out.double() - ref)[fin].abs().max() <= 1e-5 * ref[fin].abs().max()


@pytest.mark.parametrize("offset,pad", [(1, 0), (2, 0), (0, 3)])
def test_misaligned_mxfp4_cache(offset, pad, gen):
    # MXFP4 codes are read as 32-bit words; a cache view that is not 4-byte aligned (address or
    # page stride) takes the byte-load path and must give the same result, bit for bit
    q, cache, w, bt, ctx = to_device(make_case(gen, ctx=[5, 190, 64, 130]))
    odd = misaligned_copy(cache, offset, pad)
    assert odd.data_ptr() % 4 or odd.stride(0) % 4
    assert torch.equal(idsa.paged_indexer_logits(q, odd, w, bt, ctx), idsa.paged_indexer_logits(q, cache, w, bt, ctx))
    for a, b in zip(idsa.paged_indexer_topk(q, odd, w, bt, ctx, 40), idsa.paged_indexer_topk(q, cache, w, bt, ctx, 40)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fn")])
def test_gather_feeds_prefill_topk(fmt, flavor, gen):
    q, cache, w, bt, ctx = make_case(gen, fmt=fmt, flavor=flavor, ctx=[0, 50, 70, 130])
    k, ks, ke = idsa.paged_gather(to_device(cache), to_device(bt), to_device(ctx), fmt=fmt, fp8_flavor=flavor)
    want_a, want_s, want_ks, want_ke = reference.paged_gather(cache, bt, ctx, fmt, 64)
    assert torch.equal(ks.cpu(), want_ks) and torch.equal(ke.cpu(), want_ke)
    assert ke[-1].item() == 250 and k[0].shape[0] == 250
    raw_s = k[1].view(torch.uint8).reshape(250, -1) if fmt == "fp8" else k[1]
    assert torch.equal(k[0].view(torch.uint8).cpu(), want_a) and torch.equal(raw_s.cpu(), want_s)
    b, n, h, d = q.shape
    ts, te = idsa.paged.token_ranges(ks, ke, n)
    vals, idx = idsa.indexer_topk(to_device(q.reshape(b * n, h, d)), k, to_device(w.reshape(b * n, h)), 16,
                                  k_start=ts, k_end=te)
    local = torch.where(idx >= 0, idx - ts.unsqueeze(1), -1).reshape(b, n, 16)
    assert_paged_topk(vals.reshape(b, n, 16), local, paged_oracle((q, cache, w, bt, ctx), fmt, flavor), 16)


def test_gather_total_rows(gen):
    _, cache, _, bt, ctx = make_case(gen, ctx=[3, 64, 0, 20])
    for total in (100, 70):  # more rows than the 87 live (zero tail), fewer (truncated ranges)
        k, ks, ke = idsa.paged_gather(to_device(cache), to_device(bt), to_device(ctx), total_rows=total)
        want = reference.paged_gather(cache, bt, ctx, "mxfp4", 64, total)
        assert k[0].shape == (total, 32)
        for got, exp in zip((k[0], k[1], ks, ke), want):
            assert torch.equal(got.cpu(), exp)
    assert ke.tolist() == [3, 67, 67, 70]


def test_empty_inputs(gen):
    q, cache, w, bt, ctx = make_case(gen, ctx=[0, 0])
    vals, idx = idsa.paged_indexer_topk(*to_device((q, cache, w, bt, ctx)), 5)
    assert (idx == -1).all() and (vals == float("-inf")).all()
    # max_pages = 0
    v, i = idsa.paged_indexer_topk(*to_device((q, cache, w, bt[:, :0], ctx)), 5)
    assert v.shape == (2, 2, 5) and (i == -1).all()
    assert idsa.paged_indexer_logits(*to_device((q, cache, w, bt[:, :0], ctx))).shape == (2, 2, 0)
    # batch 0
    v, i = idsa.paged_indexer_topk(*to_device((q[:0], cache, w[:0], bt[:0], ctx[:0])), 5)
    assert v.shape == (0, 2, 5)


def test_split_plan_fills_the_gpu():
    cfg = configs.PAGED["sm90"]
    for b, max_len, topk in [(1, 262144, 1024), (8, 262144, 1024), (64, 32768, 512), (128, 65536, 1024)]:
        hp, nt, g = paged_launch.tiles(1, 64, cfg.rows)
        plan = paged_launch.split_plan(b, g, max_len, topk, cfg, 132 * cfg.progs_per_sm)
        items = b * g * plan.splits
        assert 132 <= items, (b, plan)
        assert items <= 132 * cfg.progs_per_sm or plan.chunk == cfg.chunk_max, (b, plan)  # one wave unless chunk-bound
        assert cfg.chunk_min <= plan.chunk <= cfg.chunk_max and plan.chunk % cfg.bn == 0
        assert plan.splits * plan.chunk >= max_len and plan.kp == min(topk, plan.chunk)
        assert items * plan.sub <= 132 * cfg.progs_per_sm or plan.sub == 1
        assert plan.chunk % (plan.sub * cfg.bn) == 0 and (plan.sub == 1 or plan.chunk // plan.sub >= cfg.score_min)
    # one request: 128 chunks of 1024 rows (the lists' floor), each scored by 4 programs of 256 rows
    plan = paged_launch.split_plan(1, 1, 131072, 512, cfg, 132 * cfg.progs_per_sm)
    assert (plan.chunk, plan.splits, plan.sub) == (1024, 128, 4)
    assert paged_launch.split_plan(4, 1, 1024, 512, cfg, 264).splits == 1
    for max_len in (64, 1088, cfg.split_min):  # short contexts: one chunk, no merge launches
        plan = paged_launch.split_plan(1, 1, max_len, 512, cfg, 264)
        assert plan.splits == 1 and max_len <= plan.chunk < max_len + cfg.bn and plan.kp == 512
    assert paged_launch.split_plan(1, 1, cfg.split_min + cfg.bn, 512, cfg, 264).splits > 1


def _ok_args():
    g = torch.Generator().manual_seed(1)
    return make_case(g, b=2, ctx=[3, 70], d=32, h=2)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda q, c, w, bt, cl: (q[0], c, w, bt, cl), ValueError, "q must be"),
    (lambda q, c, w, bt, cl: (q.to(torch.float8_e4m3fn), c, w, bt, cl), TypeError, "q must be bf16/fp16/fp32"),
    (lambda q, c, w, bt, cl: (q.double(), c, w, bt, cl), TypeError, "q must be bf16/fp16/fp32"),
    (lambda q, c, w, bt, cl: (q[..., :16], c, w, bt, cl), ValueError, "head_dim"),
    (lambda q, c, w, bt, cl: (q[..., :24], c, w, bt, cl), ValueError, "power of two"),
    (lambda q, c, w, bt, cl: ("q", c, w, bt, cl), TypeError, "q must be a torch.Tensor"),
    (lambda q, c, w, bt, cl: (q, c.view(torch.int8), w, bt, cl), TypeError, "kv_cache must be uint8"),
    (lambda q, c, w, bt, cl: (q, c[:, :100], w, bt, cl), ValueError, "kv_cache must be"),
    (lambda q, c, w, bt, cl: (q, c.flatten(), w, bt, cl), ValueError, "kv_cache must be"),
    (lambda q, c, w, bt, cl: (q, c.t().contiguous().t(), w, bt, cl), ValueError, "kv_cache: each page"),
    (lambda q, c, w, bt, cl: (q, c, w[:, :1], bt, cl), ValueError, "weights must have shape"),
    (lambda q, c, w, bt, cl: (q, c, w.int(), bt, cl), TypeError, "weights must be"),
    (lambda q, c, w, bt, cl: (q, c, w, bt.long(), cl), TypeError, "block_table must be int32"),
    (lambda q, c, w, bt, cl: (q, c, w, bt[0], cl), ValueError, "block_table must be"),
    (lambda q, c, w, bt, cl: (q, c, w, bt[:1], cl), ValueError, "block_table has 1 rows"),
    (lambda q, c, w, bt, cl: (q, c, w, bt, cl.long()), TypeError, "context_lens must be int32"),
    (lambda q, c, w, bt, cl: (q, c, w, bt, cl[:1]), ValueError, "context_lens must have shape"),
    (lambda q, c, w, bt, cl: (q, c, w, bt.to("meta"), cl), ValueError, "on meta"),
    (lambda q, c, w, bt, cl: (q, c.to("meta"), w, bt, cl), ValueError, "on meta"),
])
def test_bad_inputs(mutate, exc, match):
    args = mutate(*_ok_args())
    with pytest.raises(exc, match=match):
        idsa.paged_indexer_topk(*args, 4)
    with pytest.raises(exc, match=match):
        idsa.paged_indexer_logits(*args)


def test_bad_format_and_topk():
    q, c, w, bt, cl = _ok_args()
    with pytest.raises(ValueError, match="fmt"):
        idsa.paged_indexer_topk(q, c, w, bt, cl, 4, fmt="int4")
    with pytest.raises(ValueError, match="fp8_flavor"):
        idsa.paged_indexer_topk(q, c, w, bt, cl, 4, fmt="fp8", fp8_flavor="e5m2")
    with pytest.raises(ValueError, match="kv_cache must be"):  # an mxfp4 cache read as fp8
        idsa.paged_indexer_topk(q, c, w, bt, cl, 4, fmt="fp8")
    with pytest.raises(ValueError, match="topk"):
        idsa.paged_indexer_topk(q, c, w, bt, cl, 0)
    with pytest.raises(TypeError, match="topk"):
        idsa.paged_indexer_topk(q, c, w, bt, cl, 2.0)
    with pytest.raises(TypeError, match="q\\[1\\]"):
        idsa.paged_indexer_topk((q.view(torch.uint8), torch.zeros(2, 2, 2, 1)), c, w, bt, cl, 4)
    with pytest.raises(ValueError, match="row size"):
        idsa.paged_gather(c[:, :640], bt, cl)
    with pytest.raises(ValueError, match="total_rows"):
        idsa.paged_gather(c, bt, cl, total_rows=-1)


def test_opcheck(gen):
    q, c, w, bt, cl = (to_device(x) for x in _ok_args())
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.inductor_dsa.paged_indexer_logits.default,
                          (q, None, c, w, bt, cl, "mxfp4", "fn"), test_utils=utils)
    torch.library.opcheck(torch.ops.inductor_dsa.paged_indexer_topk.default,
                          (q, None, c, w, bt, cl, 4, "mxfp4", "fn"), test_utils=utils)
    torch.library.opcheck(torch.ops.inductor_dsa.paged_gather.default, (c, bt, cl, 80, "mxfp4"), test_utils=utils)


def test_compiled_call_names_the_op(gen):
    q, c, w, bt, cl = (to_device(x) for x in _ok_args())

    def fn(q, c, w, bt, cl):
        vals, idx = idsa.paged_indexer_topk(q, c, w, bt, cl, 4)
        return vals * 2, idx

    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    (vals, idx), codes = run_and_get_code(torch.compile(fn, fullgraph=True), q, c, w, bt, cl)
    assert any("inductor_dsa.paged_indexer_topk" in code for code in codes)
    ref = reference.paged_indexer_logits(*_ok_args())
    assert_paged_topk(vals / 2, idx, ref, 4)


def test_compiled_call_compiles_once(gen):
    """The metadata checks' memo (checks._PASSED) is not read while tracing: a dict lookup there
    made dynamo guard on the memo, which the first call fills, so the second call recompiled."""
    from torch._dynamo.testing import CompileCounter
    q, c, w, bt, cl = (to_device(x) for x in _ok_args())
    checks._PASSED.clear()
    counter = CompileCounter()
    torch._dynamo.reset()
    fn = torch.compile(lambda *x: idsa.paged_indexer_topk(*x, 4, check_values=False), backend=counter, fullgraph=True)
    for _ in range(3):
        fn(q, c, w, bt, cl)
    assert counter.frame_count == 1


def _random_table(gen, dtype, spread=20):
    """16 random floats of many magnitudes, both signs, a zero (not E2M1: any table must decode)."""
    t = torch.randn(16, generator=gen) * torch.exp2(torch.randint(-spread, spread, (16,), generator=gen).float())
    t[3] = 0.0
    return t.to(dtype)


@pytest.mark.parametrize("split", ["nosplit", "split48-bn16"], indirect=True)
@pytest.mark.parametrize("q_dtype,t_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                             (torch.float16, torch.float16)])
def test_table_operand_matches_oracle(q_dtype, t_dtype, split, gen):
    """MXFP4 codes decoded through a 16-entry table operand (keys fp32(table[code] * 2^(s - 127)),
    fp32-accurate dots), top-k and logits vs the fp64 oracle of the same table; subnormal and
    huge scale bytes included (E8M0 0 and 254 on some rows)."""
    q, cache, w, bt, ctx = make_case(gen, d=64, ctx=[0, 70, 190])
    spread = 4 if torch.float16 in (q_dtype, t_dtype) else 30  # fp16: no overflow
    q = (q.float() * torch.exp2(torch.randint(-spread, spread, q.shape[:3], generator=gen).float())[..., None]).to(q_dtype)
    for p in bt[:, :2].flatten().unique().tolist():
        if 0 <= p < cache.shape[0]:
            cache[p, PAGE * 32 + torch.randint(0, PAGE * 2, (4,), generator=gen)] = 0
            cache[p, PAGE * 32 + torch.randint(0, PAGE * 2, (2,), generator=gen)] = 200
    table = _random_table(gen, t_dtype, min(spread, 8))
    case = (q, cache, w, bt, ctx)
    ref = reference.paged_indexer_logits(*case, table=table)
    assert not torch.equal(ref, reference.paged_indexer_logits(*case))  # the table is used
    vals, idx = idsa.paged_indexer_topk(*to_device(case), 30, table=table.to(DEVICE))
    assert_paged_topk(vals, idx, ref, 30)
    logits = idsa.paged_indexer_logits(*to_device(case), table=table.to(DEVICE)).cpu()
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(logits))
    assert (logits[fin].double() - ref[fin]).abs().max() <= 1e-5 * ref[fin].abs().max()


def test_table_operand_keys_are_fp32_products(gen):
    """The oracle's keys: fp32(table[nibble] * 2^(s - 127)), low nibble first, 2^-127 subnormal."""
    table = _random_table(gen, torch.float32)
    payload = torch.tensor([[0x21] + [0] * 15], dtype=torch.uint8)
    for s in (0, 1, 127, 254):
        k = formats.decode_rows(payload, torch.tensor([[s]], dtype=torch.uint8), "mxfp4", table=table)
        want = (table.double()[[1, 2]] * 2.0 ** (s - 127)).float()
        assert torch.equal(k[0, :2], want)


def test_table_operand_rejected_when_malformed():
    q, cache, w, bt, ctx = make_case(torch.Generator().manual_seed(0), d=32, ctx=[5])
    for bad, err in [(torch.zeros(15), TypeError), (torch.zeros(16, dtype=torch.float64), TypeError),
                     (torch.zeros(16, dtype=torch.int32), TypeError), (torch.zeros(2, 8), TypeError)]:
        with pytest.raises(err, match="table must be 16"):
            idsa.paged_indexer_topk(q, cache, w, bt, ctx, 4, table=bad)
    fq, fcache, fw, fbt, fctx = make_case(torch.Generator().manual_seed(0), fmt="fp8", d=32, ctx=[5])
    with pytest.raises(ValueError, match="table decodes MXFP4 codes"):
        idsa.paged_indexer_logits(fq, fcache, fw, fbt, fctx, fmt="fp8", table=torch.zeros(16))
